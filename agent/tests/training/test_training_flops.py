"""MFU arithmetic: FLOPs per token, peak-FLOPS lookup, and the per-step tflops/mfu fields."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from training_support import recorded

from gpulse.channel.protocol import RECORD_FILE
from gpulse.training import Run
from gpulse.training.flops import FORMULA_6N_ATTN, FORMULA_LORA, FlopsModel, from_model, lookup_peak, throughput


def test_flops_per_token_is_6n_plus_the_attention_term() -> None:
    m = FlopsModel(n_params=1000, n_layers=2, n_heads=4, head_dim=8)
    assert m.per_token(16) == 6 * 1000 + 12 * 2 * 4 * 8 * 16 == 18288
    assert m.formula == FORMULA_6N_ATTN
    assert FlopsModel(n_params=1000).per_token(16) == 6000  # no config: 6N only


def test_frozen_weights_skip_their_weight_gradients() -> None:
    m = FlopsModel(n_params=1000, n_layers=2, n_heads=4, head_dim=8, trainable_fraction=0.01)
    assert m.per_token(16) == pytest.approx(6 * 1000 * (2 + 0.01) / 3 + 12288)
    assert m.formula == FORMULA_LORA


def test_throughput_and_mfu_from_tokens_and_time() -> None:
    tflops, mfu = throughput(18288, tokens=1000, seconds=2.0, peak=1e9)
    assert tflops == pytest.approx(18288 * 1000 / 2 / 1e12)
    assert mfu == pytest.approx(18288 * 1000 / 2 / 1e9)
    assert throughput(1.0, 1, 1.0, None)[1] is None


def test_parameters_are_counted_without_embeddings_from_a_hugging_face_model() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64))
    m = from_model(model)
    assert m.n_params == model.num_parameters(exclude_embeddings=True)  # transformers' own count agrees
    assert (m.n_layers, m.n_heads, m.head_dim) == (1, 2, 16)
    assert m.trainable_fraction == 1.0
    for p in model.transformer.h.parameters():
        p.requires_grad_(False)
    frozen = from_model(model)
    assert 0 < frozen.trainable_fraction < 1 and frozen.formula == FORMULA_LORA


@pytest.mark.parametrize(
    ("name", "dtype", "label", "peak"),
    [
        ("NVIDIA H200", "bf16", "H200 SXM", 989e12),
        ("NVIDIA H200 NVL", "bf16", "H200 NVL", 835e12),
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, "H100 SXM", 989e12),
        ("NVIDIA H100 PCIe", "fp16", "H100 PCIe", 756e12),
        ("NVIDIA H20", "bf16", "H20", 148e12),
        ("NVIDIA A100-SXM4-80GB", "bfloat16", "A100", 312e12),
        ("NVIDIA A100-SXM4-40GB", "tf32", "A100", 156e12),
        ("NVIDIA A100-PCIE-40GB", torch.float32, "A100", 19.5e12),
        ("NVIDIA L4", "bf16", "L4", 121e12),
        ("NVIDIA B200", "bf16", "B200", 2.25e15),
    ],
)
def test_peak_flops_are_looked_up_by_device_name_and_dtype(name, dtype, label, peak) -> None:
    assert lookup_peak(name, dtype) == (label, peak)


def test_unknown_devices_and_unsupported_dtypes_have_no_peak() -> None:
    assert lookup_peak("Tesla T4", "bf16") is None
    assert lookup_peak("Tesla V100-SXM2-16GB", "bf16") is None
    with pytest.raises(ValueError):
        lookup_peak("NVIDIA H100", "int4")


def test_each_step_carries_tflops_and_mfu_and_the_run_names_its_formula(tmp_path: Path) -> None:
    run = Run(output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), flops_per_token=1e6, peak_flops=1e12)
    for _ in range(3):
        with run.step(samples=4, tokens=4096):
            torch.ones(256, 256) @ torch.ones(256, 256)
    run.finish()
    steps = recorded(tmp_path / RECORD_FILE, "train_step")
    assert len(steps) == 3
    for p in steps:
        f = p.fields
        assert f["tflops"] == pytest.approx(1e6 * 4096 / f["step_time_s"] / 1e12)
        assert f["mfu"] == pytest.approx(f["tflops"] * 1e12 / 1e12)
    end = recorded(tmp_path / RECORD_FILE, "train_run")[-1].fields
    assert (end["mfu_formula"], end["peak_flops"], end["flops_per_token"]) == ("given", 1e12, 1e6)


def test_a_watched_model_gives_flops_from_the_sequence_length_of_each_step(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=100)
    model = LlamaForCausalLM(cfg)
    n = model.num_parameters(exclude_embeddings=True)
    run = Run(output_dir=tmp_path, socket_path=str(tmp_path / "none.sock"), model=model, peak_flops=1e12)
    with run.step(samples=2, tokens=2 * 64):
        pass
    run.finish()
    (step,) = recorded(tmp_path / RECORD_FILE, "train_step")
    fpt = 6 * n + 12 * 2 * 4 * 8 * 64
    assert step.fields["tflops"] == pytest.approx(fpt * 128 / step.fields["step_time_s"] / 1e12)
    end = recorded(tmp_path / RECORD_FILE, "train_run")[-1].fields
    assert end["mfu_formula"] == FORMULA_6N_ATTN and end["flops_per_token"] == fpt
