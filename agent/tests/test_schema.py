"""The data model is one source of truth: its rules hold for every field (``agent/tests/docs/`` checks that
the docs follow it)."""

from __future__ import annotations

import re

from gpulse import schema


def test_names_are_valid_influx_identifiers_and_never_start_with_underscore():
    ident = re.compile(r"^[a-z][a-z0-9_]*$")
    for m in schema.MEASUREMENTS.values():
        assert ident.match(m.name)
        for name in (*m.all_tags, *(f.name for f in m.fields)):
            assert ident.match(name), (m.name, name)


def test_a_tag_and_a_field_never_share_a_name():
    for m in schema.MEASUREMENTS.values():
        assert not set(m.all_tags) & set(m.by_name), m.name


def test_gpu_measurements_carry_the_stable_gpu_tags_and_pid_is_never_a_tag():
    for name in ("gpu", "gpu_info", "gpu_process", "gpu_event"):
        assert schema.MEASUREMENTS[name].tags[:4] == ("host", "gpu", "uuid", "model")
    for m in schema.MEASUREMENTS.values():
        assert "pid" not in m.all_tags


def test_downsampled_suffix_names_do_not_collide_with_declared_fields():
    for m in schema.MEASUREMENTS.values():
        for f in m.fields:
            if f.downsample == "mean":
                for suffix in schema.DOWNSAMPLE_SUFFIXES:
                    assert f.name + suffix not in m.by_name


def test_open_fields_accept_only_their_pattern():
    step = schema.MEASUREMENTS["train_step"]
    assert step.field_type("log_loss") == "float"
    assert step.field_type("phase_data_prep_s") == "float"
    assert step.field_type("step") == "int"
    assert step.field_type("loss") is None
    assert schema.MEASUREMENTS["gpu"].field_type("made_up") is None
