"""The GPU (CuPy) profiling path, run on this CPU-only machine through a stand-in CuPy module
that delegates arrays to numpy and events to perf_counter: it checks the wiring (device query,
CUDA-event timing, synchronisation, float16, environment record), not GPU speed."""

import sys
import time
import types

import numpy as np
import pytest

from planner.model.load import model_from_dict
from planner.profiling import profiler as profile
from planner.profiling.profiler import profile_model

TINY = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "num_kv_heads": 2, "ffn_hidden_size": 128, "mlp": "swiglu", "vocab_size": 256,
        "seq_length": 32}


class _Event:
    def record(self):
        self.t = time.perf_counter()


def _fake_cupy():
    calls = {"sync": 0}

    class Device:
        def synchronize(self):
            calls["sync"] += 1

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, getDeviceProperties=lambda i: {"name": b"Fake GPU"},
        memGetInfo=lambda: (8 * 1024**3, 16 * 1024**3), runtimeGetVersion=lambda: 12040)
    cuda = types.SimpleNamespace(runtime=runtime, Event=_Event, Device=Device,
                                 get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3)
    module = types.ModuleType("cupy")
    module.__dict__.update({k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    module.cuda, module.__version__ = cuda, "0.0-fake"
    return module, calls


def test_gpu_path_profiles_with_cuda_events(monkeypatch):
    fake, calls = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    # numpy has no fast float16 matmul: keep the device probe small on this stand-in
    real_probe = profile.probe_speed
    monkeypatch.setattr(profile, "probe_speed", lambda xp, dtype, n=64: real_probe(xp, dtype, 64))
    prof = profile_model(model_from_dict(TINY), device="gpu", repeats=2, warmup=1, budget_s=5)
    assert prof.device == "gpu" and prof.device_name == "Fake GPU" and prof.dtype == "float16"
    assert prof.environment["cupy"] == "0.0-fake" and calls["sync"] > 0
    assert all(t.fwd_s > 0 and t.bwd_input_s > 0 for t in prof.layers)


def test_gpu_without_a_device_is_one_clear_error(monkeypatch):
    fake, _ = _fake_cupy()

    def no_device():
        raise RuntimeError("cudaErrorNoDevice")

    fake.cuda.runtime.getDeviceCount = no_device
    monkeypatch.setitem(sys.modules, "cupy", fake)
    from planner.core.errors import PlanInputError
    with pytest.raises(PlanInputError, match="no usable NVIDIA GPU"):
        profile_model(model_from_dict(TINY), device="gpu")
