"""Devices (modulelens.device): parsing, the one policy for "CUDA asked for, none here" (the same
error from every tool, through the CLI and MCP), and the CUDA timing hooks (a fake CUDA layer
here; the real one on a GPU)."""

from __future__ import annotations

import anyio
import pytest
import torch

import modulelens.device as device
from modulelens.device import (
    CudaEvents,
    DeviceUnavailable,
    device_of,
    is_cuda,
    parse,
    require,
    runs_here,
    same_device,
)
from modulelens.errors import ModuleLensError
from modulelens.timing import CallableSide, ThreadChoice, TimingPlan, measure_speedup
from modulelens.timing.callables import cuda_batch_seconds

NO_CUDA = not torch.cuda.is_available()
needs_no_gpu = pytest.mark.skipif(not NO_CUDA, reason="the refusal is seen only where torch sees no CUDA device")

# -- parsing and the policy -------------------------------------------------------------------


def test_parse_reads_what_torch_reads_and_names_a_malformed_device():
    assert parse("cpu") == torch.device("cpu") and parse(" cuda:1 ") == torch.device("cuda", 1)
    assert parse(torch.device("cuda")) == torch.device("cuda")
    for bad in ("gpu", "cuda:x", "", "cuda:-1"):
        with pytest.raises(ModuleLensError) as e:
            parse(bad)
        assert e.value.message == f"device {bad!r} is not a device torch knows"
        assert "[--device cpu]" in e.value.hint and not isinstance(e.value, DeviceUnavailable)


def test_same_device_reads_cuda_as_cuda_0():
    assert same_device("cuda", "cuda:0") and same_device("cpu", torch.device("cpu"))
    assert not same_device("cuda", "cuda:1") and not same_device("cpu", "cuda")


def test_is_cuda_and_device_of():
    assert is_cuda("cuda") and is_cuda("cuda:3") and is_cuda(torch.device("cuda", 0))
    assert not is_cuda("cpu") and not is_cuda("meta") and not is_cuda("cudax") and not is_cuda("gpu")
    assert device_of(torch.zeros(1)) == torch.device("cpu")
    assert device_of(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert device_of(torch.nn.BatchNorm1d(2, affine=False)) == torch.device("cpu")  # buffers only
    assert device_of(torch.nn.ReLU()) == torch.device("cpu")  # nothing stored


def test_cpu_and_other_devices_pass_unchanged():
    assert require("cpu") == "cpu" and require(" cpu ") == "cpu" and require(torch.device("cpu")) == "cpu"
    assert require("meta") == "meta" and runs_here("cpu")


@needs_no_gpu
def test_cuda_without_a_gpu_is_one_refusal_naming_the_device_and_the_fix():
    for asked in ("cuda", "cuda:0", torch.device("cuda", 1)):
        assert not runs_here(asked)
        with pytest.raises(DeviceUnavailable) as e:
            require(asked)
        assert e.value.message == f"device {str(asked)!r} was asked for, but torch sees no CUDA device on this machine"
        assert e.value.hint == "pass [--device cpu] to run on the CPU, or run on a machine with a GPU"
    with pytest.raises(DeviceUnavailable) as e:
        require("cuda", can_choose=False)  # a tool without a device argument: only the machine can change
    assert e.value.hint == "run on a machine with a GPU"


def test_a_cuda_index_past_the_devices_torch_sees_is_refused(monkeypatch):
    monkeypatch.setattr(device, "_cuda_count", lambda: 2)
    assert require("cuda") == "cuda" and require("cuda:1") == "cuda:1" and runs_here("cuda:1")
    with pytest.raises(DeviceUnavailable, match=r"device 'cuda:2' was asked for, but torch sees only 2 CUDA device"):
        require("cuda:2")


def test_no_bare_cuda_test_outside_the_device_module():
    from pathlib import Path

    root = Path(device.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "device.py" and 'startswith("cuda")' in p.read_text()]
    assert offenders == []


# -- the same refusal from every tool, through the CLI and MCP -------------------------------

MESSAGE = "device 'cuda' was asked for, but torch sees no CUDA device on this machine"


def _calls(repo, card):
    """(CLI arguments, MCP tool, MCP arguments) asking replay, profile and validate for CUDA."""
    source = "// never compiled: the device is refused first\n"
    return [
        (["replay-module", "sm"], "replay_module", {"ref": "sm"}),
        (["profile", "sm"], "profile", {"target": "sm"}),
        (["profile", card], "profile", {"target": card}),
        (["validate-kernel", "--source-text", source, "--target", card, "--backend", "cpp"], "validate_kernel",
         {"source_text": source, "target": card, "backend": "cpp"}),
        (["validate-kernel", "--source-text", source, "--target", "sm"], "validate_kernel",  # a ModelNew
         {"source_text": source, "target": "sm"}),
    ]


@needs_no_gpu
def test_cuda_asked_for_is_the_same_error_from_every_tool_in_the_cli(cli, softmax_card):
    repo, card = softmax_card
    for args, _, _ in _calls(repo, card):
        code, data, result = cli(*args, "--device", "cuda", "--repo", repo, "--json")
        assert code == 2, result.output
        assert data == {"error": MESSAGE, "type": "DeviceUnavailable",
                        "hint": "pass --device cpu to run on the CPU, or run on a machine with a GPU"}, args
        code, _, result = cli(*args, "--device", "cuda", "--repo", repo)
        assert code == 2 and f"error: {MESSAGE}" in result.stderr and "--device cpu" in result.stderr


@needs_no_gpu
def test_cuda_asked_for_is_the_same_error_from_every_tool_over_mcp(softmax_card):
    from mcp import Client

    from modulelens.mcp_server.server import build_server
    from modulelens.tools import all_tools

    repo, card = softmax_card

    async def main():
        async with Client(build_server(all_tools(), repo_root=repo)) as client:
            return [await client.call_tool(tool, {**arguments, "device": "cuda"})
                    for _, tool, arguments in _calls(repo, card)]

    for res in anyio.run(main):
        assert res.is_error
        assert res.content[0].text == (f"DeviceUnavailable: {MESSAGE}\n"
                                       "hint: pass device=cpu to run on the CPU, or run on a machine with a GPU")


def test_a_malformed_device_is_a_clear_error_in_the_cli(cli, softmax_card):
    repo, card = softmax_card
    code, data, _ = cli("replay-module", "sm", "--device", "gpu", "--repo", repo, "--json")
    assert code == 2 and data["error"] == "device 'gpu' is not a device torch knows"
    assert "--device cuda:N" in data["hint"]


# -- CUDA timing hooks --------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 0.0


class FakeEvent:
    def __init__(self, log, clock):
        self.log, self.clock, self.t = log, clock, None

    def record(self, stream=None):
        self.log.append(("record", stream))
        self.t = self.clock.now

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3  # milliseconds, as CUDA events report


class FakeCuda:
    def __init__(self, clock):
        self.log: list = []
        self.clock = clock

    def Event(self, enable_timing=False):  # noqa: N802 - torch.cuda's name
        assert enable_timing
        return FakeEvent(self.log, self.clock)

    def current_stream(self, device=None):
        return "stream0"

    def synchronize(self, device=None):
        self.log.append(("sync", device))

    def get_device_properties(self, device):
        return type("P", (), {"L2_cache_size": 1 << 20})()


def test_cuda_events_flush_l2_record_on_the_current_stream_and_synchronise():
    clock = FakeClock()
    cuda = FakeCuda(clock)
    layer = CudaEvents("cuda:0", cuda)
    flushed = []
    layer.flush_l2 = lambda: flushed.append(True)  # no device memory here

    def kernel():
        clock.now += 5e-6

    seconds = cuda_batch_seconds(kernel, 10, layer)
    assert seconds == pytest.approx(50e-6)
    assert flushed == [True]
    assert cuda.log == [("sync", "cuda:0"), ("record", "stream0"), ("record", "stream0"), ("sync", "cuda:0")]
    side = CallableSide("k", kernel, "cuda:0", cuda=layer)
    assert "CUDA events" in side.timer and side.batch(4, 0) == pytest.approx(20e-6)


def test_cuda_events_time_each_call_alone_after_an_untimed_setup():
    clock = FakeClock()
    log: list[str] = []

    def setup():
        log.append("setup")
        clock.now += 1.0  # slow, but not counted

    def call():
        log.append("call")
        clock.now += 0.001

    cuda = FakeCuda(clock)
    side = CallableSide("y", call, "cuda:0", cuda=CudaEvents("cuda:0", cuda), setup=setup)
    assert side.batch(2, 0) == pytest.approx(0.002) and log == ["setup", "call"] * 2
    assert cuda.log.count(("sync", "cuda:0")) == 4


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
def test_cuda_events_on_a_real_gpu():
    x = torch.randn(1024, 1024, device="cuda")
    assert require("cuda") == "cuda" and runs_here("cuda:0")
    device.synchronize("cuda")
    m = measure_speedup(CallableSide("a", lambda: torch.softmax(x, -1), "cuda"),
                        CallableSide("b", lambda: torch.softmax(x, -1), "cuda"),
                        TimingPlan(budget_s=2.0), ThreadChoice(threads=1, why="gpu"))
    assert m.rounds >= 6 and "CUDA events" in m.base.timer
    assert CudaEvents("cuda").seconds(lambda: torch.softmax(x, -1), 3) > 0


@needs_no_gpu
def test_a_sandbox_checker_given_cuda_refuses_instead_of_judging(softmax_card, tmp_path):
    """Where the device is checked again, in the worker (a Ray node without a GPU, a card recorded
    on CUDA): a refusal that reaches the caller as the same error, not a rejected candidate."""
    from modulelens.kernels import KernelSource
    from modulelens.validation.card import run_task
    from modulelens.validation.messages import RefusedResult, ValidateCardTask
    from modulelens.validation.sandboxed import validation_report

    repo, card = softmax_card
    task = ValidateCardTask(repo=str(repo), candidate=KernelSource(backend="cpp", source="// not compiled\n"),
                            build_dir=str(tmp_path), card_id=card, device="cuda", time=False)
    result = run_task(task, lambda stage: None)
    assert isinstance(result, RefusedResult) and result.healthy
    with pytest.raises(ModuleLensError) as e:
        validation_report(result, "cpp")
    assert e.value.message == MESSAGE and "[--device cpu]" in e.value.hint


@needs_no_gpu
def test_a_module_checker_given_cuda_refuses_instead_of_running_on_the_captured_device(softmax_card, tmp_path):
    """The module checker honours the task's device (it once ran on the captured one whatever was
    asked): CUDA here is the same refusal, before anything is built."""
    from modulelens.validation.messages import ModuleSource, RefusedResult, ValidateModuleTask
    from modulelens.validation.module import run_task

    repo, _ = softmax_card
    task = ValidateModuleTask(repo=str(repo), capture="sm", build_dir=str(tmp_path), device="cuda", time=False,
                              candidate=ModuleSource(source="raise SystemExit('never loaded')\n", class_name="ModelNew"))
    result = run_task(task, lambda stage: None)
    assert isinstance(result, RefusedResult) and result.healthy
    assert result.message == MESSAGE and "[--device cpu]" in result.hint
