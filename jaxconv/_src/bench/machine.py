"""What a benchmark result must say about the machine: CPU, ISA, threads, both oneDNNs, peak.

The peak is the arithmetic limit of the cores, ``cores x FMA units x float32 lanes x 2 x
clock``, measured: the oneDNN handler runs independent vector FMAs on registers on every core
(``library.fma_peak_gflops``), which counts the units, the lanes and the clock the cores really
run at. The nominal figure from the CPU's description is recorded beside it, each factor with
where it came from (the lanes from the ISA flags, the FMA units from the CPU family, the clock
from ``/proc/cpuinfo``), because on a virtual machine the description can be wrong: a KVM
"AMD EPYC" reports family 23 model 1 (Zen 1) and its nominal clock whatever the host is (on a
2-core one the nominal figure was 64 GFLOP/s, the measured 75, a PyTorch matrix product 68).
``measured_matmul_gflops``, a large float32 matrix product in PyTorch (MKL), is the attainable
ceiling of dense work beside both.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import time
from typing import Any

from jaxconv._src.bench.timing import cpu_model
from jaxconv._src.lowering.measured import usable_cpus


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = (s.strip() for s in line.split(":", 1))
                    info.setdefault(k, v)
    except OSError:
        pass
    return info


def _fma_units(info: dict[str, str], flags: set[str]) -> tuple[int, str]:
    vendor, family = info.get("vendor_id", ""), int(info.get("cpu family", "0") or 0)
    if vendor == "AuthenticAMD" and family == 23 and int(info.get("model", "0") or 0) < 0x30:
        return 1, "AMD Zen 1/Zen+ (family 23, model < 0x30): 256-bit FMA as two 128-bit halves"
    if vendor == "AuthenticAMD" and family >= 23:
        return 2, f"AMD family {family}: two 256-bit FMA pipes (AVX-512 on Zen 4 double-pumped)"
    if vendor == "GenuineIntel" and "fma" in flags:
        return 2, "Intel with FMA: two FMA ports (some AVX-512 Xeons have one: then half)"
    return 2, "unknown core: two FMA units assumed"


def nominal_peak(cores: int | None = None) -> dict[str, Any]:
    """The float32 peak the CPU's description implies, and where each factor came from."""
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    if lanes == 16 and info.get("vendor_id") == "AuthenticAMD":
        lanes_note = "avx512f (Zen 4: executed as 2 x 256 bits; counted as one unit of 16 lanes)"
        units, units_note = 1, "AMD with AVX-512: one 512-bit FMA a cycle"
    else:
        lanes_note = {16: "avx512f", 8: "avx2", 4: "sse"}[lanes]
        units, units_note = _fma_units(info, flags)
    ghz = float(info.get("cpu MHz", "0") or 0) / 1e3
    cores = cores or usable_cpus()
    return {"gflops": cores * units * lanes * 2 * ghz, "cores": cores, "fma_units": units,
            "fma_units_from": units_note, "float32_lanes": lanes, "lanes_from": lanes_note,
            "ghz": ghz, "ghz_from": "/proc/cpuinfo 'cpu MHz' (nominal on a VM; turbo not counted)",
            "formula": "cores x FMA units x float32 lanes x 2 flops x GHz"}


def peak() -> dict[str, Any]:
    """The float32 peak in GFLOP/s: measured by the handler's FMA loop on every core where it
    is loaded (``gflops``, ``how``), with the nominal figure beside it (``nominal``)."""
    from jaxconv._src.native import library
    cores = usable_cpus()
    nominal = nominal_peak(cores)
    measured = library.fma_peak_gflops(cores)
    if measured is None:
        return {"gflops": nominal["gflops"], "how": "nominal (the handler is not loaded)",
                "nominal": nominal}
    # bfloat16 dot products (AVX-512 BF16's vdpbf16ps: two products per float32 lane) run at
    # twice the float32 FMA rate; AMX's tiles faster still (not measured: reported as that)
    bf16 = 2 * measured[0] if "bfloat16" in library.status().dtypes else None
    return {"gflops": measured[0], "float32_lanes": measured[1], "cores": cores,
            "how": f"measured: {cores} threads of independent {measured[1]}-lane FMAs on "
                   "registers, 0.5 s (cores x FMA units x lanes x 2 x the running clock)",
            "bfloat16_gflops": bf16,
            "bfloat16_how": ("twice the float32 FMA rate (AVX-512 BF16 dot products)" if bf16
                             else "none: oneDNN computes no bfloat16 on this CPU"),
            "nominal": nominal}


def measured_matmul_gflops(n: int = 2048) -> float | None:
    """A float32 n x n x n matrix product in PyTorch (MKL, every core), best of 5: the
    attainable ceiling of dense float32 work here (None without torch)."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(usable_cpus())
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(5))
    return 2 * n ** 3 / best / 1e9


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def torch_info() -> dict[str, Any]:
    """torch's version, its bundled oneDNN's and MKL's, its CPU capability and threads."""
    try:
        import torch
    except ImportError:
        return {}
    config = torch.__config__.show()
    onednn = re.search(r"MKL-DNN v([\d.]+)", config)
    capability = re.search(r"CPU capability usage: (\w+)", config)
    return {"version": torch.__version__, "onednn": onednn.group(1) if onednn else None,
            "cpu_capability": capability.group(1) if capability else None,
            "threads": torch.get_num_threads()}


def import_openvino() -> Any | None:
    """The ``openvino`` module with its import's telemetry sent, or None where it is not installed.

    ``import openvino`` sends a telemetry event from a thread that forks a process (the
    openvino_telemetry package's sender). A fork of a process whose JAX backends run can
    deadlock it (JAX warns at the fork, an error under strict warnings), and it makes the
    parent's pages copy-on-write while contenders are timed. So a process that uses OpenVINO
    calls this before JAX's first computation: the sender is given a second to finish.
    """
    try:
        import openvino  # type: ignore[import-untyped]
    except ImportError:
        return None
    try:
        import openvino_telemetry  # type: ignore[import-untyped]
        openvino_telemetry.Telemetry().force_shutdown(1.0)
    except Exception:  # noqa: BLE001 -- no telemetry package, or one without it: nothing to wait for
        pass
    return openvino


def openvino_version() -> str | None:
    """The OpenVINO runtime's version (the serving benchmark's contender), or None: from its
    package's metadata, without importing it (which forks: :func:`import_openvino`)."""
    import importlib.metadata
    try:
        return importlib.metadata.version("openvino").split("-")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def commit() -> str | None:
    """The commit of the jaxconv tree that runs (``git describe --always --dirty``: a tree with
    changes says so): the one a docs table names. Outside a git checkout (a tree copied to
    another machine without its history), ``JAXCONV_COMMIT`` where set, else None."""
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[3]
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("JAXCONV_COMMIT") or None
    return out.stdout.strip() or os.environ.get("JAXCONV_COMMIT") or None


def describe() -> dict[str, Any]:
    """Everything a model benchmark records about the machine and the libraries (and the
    commit measured: :func:`commit`)."""
    import jax

    from jaxconv._src.native import library
    flags = set(_cpuinfo().get("flags", "").split())
    status = library.status()
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(),
            "isa_flags": sorted(flags & {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16",
                                         "avx512_fp16", "amx_tile"}),
            "jax": jax.__version__, "xla_threads": usable_cpus(),
            "jaxconv_onednn": status.line(), "jaxconv_onednn_dtypes": list(status.dtypes),
            "torch": torch_info(), "openvino": openvino_version(), "peak": peak(),
            "commit": commit()}


def result(command: str, **fields: Any) -> dict[str, Any]:
    """A benchmark script's JSON result: the command that reproduces it, this machine
    (:func:`describe`) and ``fields``."""
    return {"command": command, "machine": describe(), **fields}


def write(path: str | None, result: dict[str, Any]) -> None:
    """``result`` as indented JSON at ``path``; nothing where ``path`` is None."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
