"""Hugging Face ``Trainer`` with ``GpulseCallback`` (and through ms-swift's plugin mechanism), on CPU."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from training_support import Agent
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers import TrainerCallback as HfTrainerCallback

from gpulse.training.hf import GpulseCallback

SEQ = 16
MAX_STEPS = 4
BATCH = 2
ACCUM = 2


class SlowTokens(torch.utils.data.Dataset):
    """Token sequences that take 10 ms each to "load" (a planted input bottleneck)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        time.sleep(0.01)
        ids = torch.randint(0, 100, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def tiny_model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=SEQ))


def training_args(out: Path) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out),
        max_steps=MAX_STEPS,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUM,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        include_num_input_tokens_seen=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


@pytest.fixture
def agent(tmp_path: Path):
    a = Agent(tmp_path)
    yield a
    a.close()


def check_steps(agent: Agent, run_id: str) -> None:
    steps = sorted(agent.points("train_step"), key=lambda p: p.fields["step"])
    assert [p.fields["step"] for p in steps] == list(range(1, MAX_STEPS + 1))
    for p in steps:
        f = p.fields
        assert p.tags["run"] == run_id
        assert 0 < f["forward_s"] < f["step_time_s"]
        assert 0 < f["backward_s"] < f["step_time_s"]
        assert 0 < f["optimizer_s"] < f["step_time_s"]
        assert f["samples"] == BATCH * ACCUM
        assert f["tokens"] == BATCH * ACCUM * SEQ
        assert f["log_loss"] > 0 and "log_learning_rate" in f
        assert f["tflops"] > 0
    # the Trainer fetches all micro-batches of a step between on_step_end and on_step_begin: 4 x 10 ms
    assert all(p.fields["data_wait_s"] > 0.03 for p in steps[1:])
    runs = agent.points("train_run")
    assert [r.fields["event"] for r in runs] == ["start", "end"]
    assert runs[1].fields["status"] == "finished" and runs[1].fields["steps"] == MAX_STEPS


def test_the_trainer_callback_sends_every_optimizer_step_with_a_forward_backward_split(
    agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULSE_SOCKET", agent.path)
    callback = GpulseCallback(tags={"framework": "hf"})
    trainer = Trainer(model=tiny_model(), args=training_args(tmp_path / "out"), train_dataset=SlowTokens(),
                      callbacks=[callback])  # fmt: skip
    trainer.train()
    check_steps(agent, callback.run.run_id)
    assert {p.tags["framework"] for p in agent.points("train_step")} == {"hf"}
    assert callback.run.stats()["errors"] == {}
    assert (tmp_path / "out" / "metrics_report.json").exists()


class SlowEndOfStep(HfTrainerCallback):
    """A framework's own end-of-step work after gpulse's callback: a progress bar in ``on_step_end``,
    a log file written in ``on_log`` (ms-swift's ``logging.jsonl``)."""

    STEP_END_S, LOG_S = 0.15, 0.1

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.STEP_END_S)

    def on_log(self, args, state, control, logs=None, **kwargs):
        time.sleep(self.LOG_S)


@pytest.mark.parametrize("logging_steps", [1, 2])
def test_work_other_callbacks_do_after_gpulse_s_at_the_step_end_is_in_the_step_not_in_the_data_wait(
    agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logging_steps: int
) -> None:
    """The step ends when every callback has done its step-end work, and its logging when the step
    is logged; the data wait is the Trainer fetching the next batches (4 x 10 ms) only."""
    monkeypatch.setenv("GPULSE_SOCKET", agent.path)
    callback = GpulseCallback()
    args = training_args(tmp_path / "out")
    args.logging_steps = logging_steps
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=SlowTokens(),
                      callbacks=[callback, SlowEndOfStep()])  # fmt: skip
    trainer.train()
    steps = sorted(agent.points("train_step"), key=lambda p: p.fields["step"])
    assert [p.fields["step"] for p in steps] == list(range(1, MAX_STEPS + 1))
    for p in steps:
        f = p.fields
        logged = f["step"] % logging_steps == 0
        assert f["step_time_s"] > SlowEndOfStep.STEP_END_S + (SlowEndOfStep.LOG_S if logged else 0.0), f
        assert ("log_loss" in f) == logged, f  # a step's logged scalars stay with it
        # forward, backward and optimizer are timed; the rest of the step is the callbacks' work
        other = f["step_time_s"] - f["forward_s"] - f["backward_s"] - f["optimizer_s"]
        assert other > SlowEndOfStep.STEP_END_S, f
    for p in steps[1:]:
        assert 0.03 < p.fields["data_wait_s"] < SlowEndOfStep.STEP_END_S, p.fields
    assert callback.run.stats()["errors"] == {}


def test_the_run_summary_comes_once_after_the_trainers_own(tmp_path: Path) -> None:
    """The Trainer prints its last log (``train_runtime``, ...) on stdout, gpulse its summary on
    stderr: read as one stream, the summary comes after it, once."""
    out = tmp_path / "out"
    callback = GpulseCallback(socket_path=str(tmp_path / "no-agent.sock"))
    trainer = Trainer(model=tiny_model(), args=training_args(out), train_dataset=SlowTokens(), callbacks=[callback])
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        trainer.train()
        callback.run.finish()  # the callback finished the run already: no second summary
    lines = said.getvalue().splitlines()
    ours = [i for i, line in enumerate(lines) if line.startswith(f"gpulse: run {callback.run.run_id} finished: ")]
    assert len(ours) == 1, said.getvalue()
    trainers = max(i for i, line in enumerate(lines) if "'train_runtime'" in line)
    assert trainers < ours[0]
    assert f"{MAX_STEPS} steps in " in lines[ours[0]] and " tokens/s)" in lines[ours[0]]  # tokens counted
    assert f"  report: {out / 'metrics_report.json'}" in lines[ours[0] :]


# -- ms-swift --------------------------------------------------------------------------------------
# ms-swift is not installed (it pulls modelscope and friends). These stand-ins reproduce, line for
# line, the parts of ms-swift 4.6.0 the registration goes through:
#   swift/callbacks/base.py      TrainerCallback(HfTrainerCallback).__init__(self, args, trainer)
#   swift/callbacks/mapping.py   callbacks_map = {...}
#   swift/utils/utils.py         import_external_file(file_path)   (--external_plugins)
#   swift/trainers/mixin.py      SwiftMixin._get_callbacks: callbacks_map[name](args, self),
#                                passed to HfTrainer.__init__(callbacks=...)
SWIFT_CALLBACKS = """
from transformers import TrainerCallback as HfTrainerCallback


class TrainerCallback(HfTrainerCallback):

    def __init__(self, args, trainer):
        self.args = args
        self.trainer = trainer


callbacks_map = {}
"""


def import_external_file(file_path: str):
    """ms-swift 4.6.0 ``swift.utils.utils.import_external_file``, verbatim in substance."""
    import os

    file_path = os.path.abspath(os.path.expanduser(file_path))
    py_dir = os.path.dirname(file_path)
    sys.path.insert(0, py_dir)
    module_name = f"_swift_external_{hashlib.sha256(file_path.encode()).hexdigest()}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, file_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


class SwiftLikeTrainer(Trainer):
    """``SwiftMixin.__init__``'s callback handling: names from ``args.callbacks`` via ``callbacks_map``."""

    def __init__(self, *a, callback_names=(), **kw):
        from swift.callbacks import callbacks_map

        callbacks = [callbacks_map[name](kw["args"], self) for name in callback_names]
        super().__init__(*a, callbacks=callbacks, **kw)


@pytest.fixture
def fake_swift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pkg = tmp_path / "fake_swift" / "swift"
    (pkg / "callbacks").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "callbacks" / "__init__.py").write_text(textwrap.dedent(SWIFT_CALLBACKS))
    monkeypatch.syspath_prepend(str(tmp_path / "fake_swift"))
    for name in [m for m in sys.modules if m == "swift" or m.startswith("swift.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m.startswith("_swift_external_")]:
        del sys.modules[name]


def test_ms_swift_external_plugin_registers_the_callback_by_name(
    fake_swift, agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulse.training import swift as plugin

    monkeypatch.setenv("GPULSE_SOCKET", agent.path)
    path = plugin.plugin_path()
    import_external_file(path)  # what --external_plugins does (before `swift` itself is imported here)
    from swift.callbacks import callbacks_map

    assert sys.path[0] == str(Path(path).parent) and sorted(p.name for p in Path(path).parent.glob("*.py")) == [
        "__init__.py",
        "gpulse_swift.py",
    ]  # the directory ms-swift puts first on sys.path shadows nothing

    assert callbacks_map["gpulse"].__name__ == "GpulseSwiftCallback"
    trainer = SwiftLikeTrainer(
        model=tiny_model(), args=training_args(tmp_path / "out"), train_dataset=SlowTokens(), callback_names=["gpulse"]
    )  # fmt: skip  (--callbacks gpulse)
    (callback,) = [c for c in trainer.callback_handler.callbacks if type(c).__name__ == "GpulseSwiftCallback"]
    assert callback.trainer is trainer
    trainer.train()
    check_steps(agent, callback.run.run_id)
