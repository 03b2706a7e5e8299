"""A rank's device: its GPU selected first, where its rows go (the GPU's free memory decides), and a CUDA
out-of-memory error as a refusal. No GPU here: a recording stand-in for ``torch.cuda`` answers what a GPU would,
and the decisions are pure functions. The order inside a real rank (real loader, real PostgreSQL):
tests/integration/horovod/test_device_order.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pgtrain.core.errors import ConfigError, PgtrainError
from pgtrain.launch.mpijob.api import GPUS_PER_WORKER_ENV
from pgtrain.models.network import mlp
from trainer.device import (
    DEVICE_RESERVE_BYTES,
    device_line,
    driver_version,
    forward_precision,
    gpus_requested,
    out_of_memory_refused,
    place_rows,
    placement,
    select_device,
    training_state_bytes,
    use_tf32,
)

GIB = 1 << 30
OOM_TEXT = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.72 GiB of which "
            "1.05 GiB is free.")


class RecordingCuda:
    """Answers as ``torch.cuda`` would on a node with ``gpus`` GPUs (none: no CUDA) and records each call."""

    def __init__(self, gpus: int = 0, free: int = 0, total: int = 140 * GIB) -> None:
        self.gpus, self.free, self.total = gpus, free, total
        self.calls: list[str] = []

    def is_available(self) -> bool:
        self.calls.append("is_available")
        return self.gpus > 0

    def device_count(self) -> int:
        self.calls.append("device_count")
        return self.gpus

    def set_device(self, device: int) -> None:
        self.calls.append(f"set_device {device}")

    def mem_get_info(self, device: int) -> tuple[int, int]:
        self.calls.append(f"mem_get_info {device}")
        return self.free, self.total

    def synchronize(self, device: int) -> None:
        self.calls.append(f"synchronize {device}")

    def get_device_name(self, device: int) -> str:
        self.calls.append(f"get_device_name {device}")
        return "NVIDIA H200"


def test_a_rank_makes_its_local_rank_s_gpu_the_current_one():
    cuda = RecordingCuda(gpus=4)
    assert select_device(2, cuda) == torch.device("cuda", 2)
    assert cuda.calls == ["is_available", "device_count", "set_device 2"]


def test_without_cuda_a_rank_computes_on_the_cpu_and_calls_nothing_else():
    cuda = RecordingCuda(gpus=0)
    assert select_device(3, cuda) == torch.device("cpu")
    assert cuda.calls == ["is_available"]


@pytest.mark.parametrize(("cuda_version", "floor"), [("13.0", "R580"), ("12.8", "R525")])
def test_a_rank_whose_pod_holds_gpus_refuses_to_train_without_cuda_naming_the_driver_floor(
        monkeypatch, cuda_version, floor):
    monkeypatch.setattr(torch.version, "cuda", cuda_version)
    cuda = RecordingCuda(gpus=0)  # what torch.cuda answers on a node whose driver is older than the build's floor
    with pytest.raises(ConfigError) as refused:
        select_device(0, cuda, gpus=8)
    assert isinstance(refused.value, PgtrainError)  # the trainer records it as the verdict "refused", not retried
    message = str(refused.value)
    assert message.startswith("this rank's worker holds 8 GPUs (gpus_per_worker) but CUDA is unavailable")
    assert f"driver must be {floor} or newer for this CUDA {cuda_version.split('.')[0]} build" in message
    assert "torch's cu126 wheels (CUDA 12.6, driver R525 or newer)" in message


def test_a_cpu_build_of_torch_on_a_gpu_worker_is_refused_naming_the_gpu_image(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ConfigError, match=r"holds 1 GPU \(gpus_per_worker\) but its torch .* is a CPU build: run "
                                          r"the GPU image \(make image-gpu"):
        select_device(0, RecordingCuda(gpus=0), gpus=1)


def test_the_gpus_a_rank_holds_come_from_the_environment_the_mpijob_sets():
    assert gpus_requested({GPUS_PER_WORKER_ENV: "8"}) == 8
    assert gpus_requested({}) == 0  # the local launcher: the CPU is a choice
    assert gpus_requested({GPUS_PER_WORKER_ENV: ""}) == 0


def test_a_gpu_rank_names_torch_s_cuda_the_driver_its_gpu_and_nccl(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    version_file = tmp_path / "version"
    version_file.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
                            "(dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 06:54:38 UTC 2025\nGCC version: gcc 13\n")
    driver = driver_version(version_file)
    assert driver == "580.65.06"
    assert driver_version(tmp_path / "absent") == "unknown"
    line = device_line(3, torch.device("cuda", 3), RecordingCuda(gpus=8), driver, "2.27.7")
    assert line == (f"rank 3: GPU 3 NVIDIA H200, torch {torch.__version__} CUDA 13.0, driver 580.65.06, "
                    "NCCL 2.27.7")
    assert device_line(0, torch.device("cpu"), RecordingCuda(), driver, "none").startswith("rank 0: CPU (torch ")


def test_a_local_rank_beyond_the_node_s_gpus_is_refused_before_any_gpu_is_selected():
    cuda = RecordingCuda(gpus=2)
    with pytest.raises(ConfigError, match=r"local rank 2 but its node shows 2 GPUs: give each worker as many GPUs "
                                          r"as it runs ranks \(gpus_per_worker\)"):
        select_device(2, cuda)
    assert "set_device 2" not in " ".join(cuda.calls)


@pytest.mark.parametrize(("rows", "model", "batch", "free", "where"), [
    (10 * GIB, GIB, GIB // 8, 20 * GIB, "device"),
    (10 * GIB, GIB, GIB // 8, 10 * GIB, "host"),  # the rows do not fit beside the model: batches copied over
    (0, GIB, GIB // 8, GIB, "refuse"),  # not even the model, a batch and the reserve
    (GIB, GIB, GIB, 3 * GIB + DEVICE_RESERVE_BYTES, "device"),  # exactly full
    (GIB, GIB, GIB, 3 * GIB + DEVICE_RESERVE_BYTES - 1, "host"),
    (GIB, GIB, GIB, 2 * GIB + DEVICE_RESERVE_BYTES - 1, "refuse"),
])
def test_where_the_rows_go_follows_the_gpu_s_free_memory(rows, model, batch, free, where):
    assert placement(rows, model, batch, free) == where


def test_a_cpu_rank_keeps_its_rows_where_they_are_without_asking_cuda():
    cuda = RecordingCuda(gpus=0)
    assert place_rows(torch.device("cpu"), cuda, 100 * GIB, GIB, GIB, 512, 2) is True
    assert cuda.calls == []


def test_a_gpu_rank_asks_its_own_gpu_and_streams_rows_that_do_not_fit(capsys):
    fits = RecordingCuda(gpus=4, free=40 * GIB)
    assert place_rows(torch.device("cuda", 3), fits, 30 * GIB, GIB, GIB // 4, 4096, 8) is True
    assert fits.calls == ["mem_get_info 3"]
    tight = RecordingCuda(gpus=4, free=10 * GIB)
    assert place_rows(torch.device("cuda", 1), tight, 30 * GIB, GIB, GIB // 4, 4096, 8) is False
    assert "30.0 GiB of rows do not fit in its 10.0 GiB free" in capsys.readouterr().out


def test_a_gpu_without_room_for_the_model_and_a_batch_is_refused_saying_what_to_change():
    cuda = RecordingCuda(gpus=1, free=GIB)
    with pytest.raises(ConfigError) as refused:
        place_rows(torch.device("cuda", 0), cuda, 5 * GIB, 2 * GIB, 256 << 20, 65536, 2)
    assert str(refused.value) == (
        "GPU 0 has 1.0 GiB free of 140.0 GiB, and training needs about 2.0 GiB for the model's state, 256 MiB for a "
        "batch of 65536 rows and 1.0 GiB beside them (its rows would stay in host memory); use a smaller batch_size "
        "or model, or a GPU no other process holds memory on")


def test_a_model_s_training_state_counts_weights_gradients_momentum_fusion_and_buffers():
    model = nn.Sequential(nn.Linear(10, 5), nn.BatchNorm1d(5))  # 55 + 10 parameters; 5 + 5 + 1 buffer values
    buffers = 5 * 4 + 5 * 4 + 8  # running mean and var (float32), num_batches_tracked (int64)
    assert training_state_bytes(model) == 65 * 24 + buffers


def run_out_of_gpu_memory() -> None:
    raise torch.cuda.OutOfMemoryError(OOM_TEXT)


def test_a_cuda_out_of_memory_error_is_a_refusal_naming_batch_size_and_world_size():
    with pytest.raises(ConfigError) as refused, out_of_memory_refused(torch.device("cuda", 0), 8192, 4):
        run_out_of_gpu_memory()
    assert isinstance(refused.value, PgtrainError)  # the trainer records PgtrainError as the verdict "refused"
    assert isinstance(refused.value.__cause__, torch.cuda.OutOfMemoryError)
    assert str(refused.value) == (
        "device cuda:0 ran out of memory training batches of 8192 rows per rank on 4 ranks (CUDA out of memory); use "
        "a smaller batch_size, a smaller model, or more ranks (world_size: fewer rows per GPU)")


def test_other_errors_pass_through_unchanged():
    with pytest.raises(RuntimeError, match="^peer closed$"), out_of_memory_refused(torch.device("cpu"), 64, 1):
        raise RuntimeError("peer closed")


class OutOfMemoryWhenTraining(nn.Module):
    """Builds and passes the trainer's probe (eval mode), then runs out of GPU memory at the first training step:
    what a batch too large for the GPU does. The ranks of tests/integration/horovod/test_device_order.py import it."""

    def __init__(self, input_dim: int, output_dim: int) -> None:
        super().__init__()
        self.net = mlp(input_dim, output_dim, (4,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            run_out_of_gpu_memory()
        return self.net(x)


def out_of_memory_when_training(input_dim: int, output_dim: int) -> nn.Module:
    return OutOfMemoryWhenTraining(input_dim, output_dim)


@pytest.fixture
def matmul_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def test_a_gpu_rank_multiplies_float32_in_tf32_and_a_cpu_rank_in_full_float32(matmul_precision):
    torch.set_float32_matmul_precision("highest")
    use_tf32(torch.device("cpu"))
    assert torch.get_float32_matmul_precision() == "highest"
    use_tf32(torch.device("cuda", 3))  # a device object needs no GPU; the setting is process-wide
    assert torch.get_float32_matmul_precision() == "high"  # TF32
    assert torch.backends.cudnn.allow_tf32 is True


def test_bf16_autocasts_the_forward_pass_and_fp32_leaves_it_alone():
    layer = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    with forward_precision(torch.device("cpu"), "bf16"):
        assert layer(x).dtype == torch.bfloat16
    with forward_precision(torch.device("cpu"), "fp32"):
        assert layer(x).dtype == torch.float32
    assert layer.weight.dtype == torch.float32  # the weights stay float32 either way
