"""The one helper per concept in mpdoctor/knowledge: version comparison, CUDA and cuDNN
numbers, byte sizes, signal names and dtype names."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mpdoctor.knowledge.dtypes import dtype_name, tensor_type
from mpdoctor.knowledge.signals import signal_name
from mpdoctor.knowledge.units import gib, parse_size
from mpdoctor.knowledge.versions import (
    at_least,
    compare,
    cuda_int_to_str,
    cudnn_version,
    is_prerelease,
    major,
    parse_message_requirement,
    parse_requires_dist,
    release,
    satisfies,
)

# --- versions ------------------------------------------------------------------------


@pytest.mark.parametrize("a, b, expect", [
    # pre-releases and dev builds are older than their release, as pip orders them
    ("2.6.0.dev20241001+cu124", "2.6.0", -1), ("2.1.0a0+git1234", "2.1.0", -1), ("2.0.0rc1", "2.0.0", -1),
    ("2.1.0a0+41361538", "2.1", -1), ("2.0.0rc1", "2.0.0rc2", -1), ("2.0.0", "2.0.0rc1", 1),
    # a local tag does not order against a public version
    ("2.6.0+cu124", "2.6.0", 0), ("2.6.0", "2.6.0+cpu", 0), ("2.5.1+cu124", "2.6", -1),
    # release numbers are padded; driver versions with leading zeros read as numbers
    ("570.26", "570.26.0", 0), ("470.239.06", "525.60.13", -1), ("535.104.05", "535.104.5", 0),
    ("0.20.1", "0.20.1", 0), ("12.4", "12.10", -1),
    # what packaging cannot read falls back to its leading release numbers
    ("2.1.0 (custom)", "2.1.0", 0), ("2.1.0 (custom)", "2.0", 1), ("2.1.0 (custom)", "2.1.0rc1", 1),
    # nothing to compare
    ("unknown", "2.0", None), ("2.0", "", None), (None, "2.0", None), ("2.0", None, None),
])
def test_compare_orders_as_pip(a, b, expect):
    assert compare(a, b) == expect
    if expect is not None:
        assert compare(b, a) == -expect


def test_at_least():
    assert at_least("2.6.0+cu124", "2.6") is True
    assert at_least("2.6.0.dev20241001+cu124", "2.6") is False
    assert at_least("unknown", "2.6") is None


@pytest.mark.parametrize("version, spec, ok", [
    ("2.6.0+cu124", ">=2.6.0", True), ("2.6.0+cu124", ">=2.6", True), ("2.5.1+cu124", ">=2.6.0", False),
    ("2.6.0.dev20241001+cu124", ">=2.6", False), ("2.1.0a0+git1234", ">=2.0", True),
    ("2.0.0rc1", ">=2.0.0", False), ("2.6.0+cu124", "==2.6.0", True),
    ("1.16.0", ">=1.3,<1.15", False), ("0.6.1", ">=0.6.1", True), ("2.4.1", "~=2.4", True), ("3.0", "~=2.4", False),
    ("2.13.0", "==2.13.*", True), ("1.0", "!=1.0", False), ("12.4", ">=12.1", True),
    ("2.1.0 (custom)", ">=2.1", True), ("anything", "", True),
    ("unknown", ">=2.0", None), ("2.0", ">=>2", None),
])
def test_satisfies(version, spec, ok):
    assert satisfies(version, spec) is ok


def test_release_major_prerelease():
    assert release("2.6.0+cu124") == (2, 6, 0)
    assert release("v12.4") == (12, 4)
    assert release("2.1.0 (custom)") == (2, 1, 0)
    assert release("unknown") is None and release(None) is None
    assert major("12.4") == 12 and major("11") == 11 and major("n/a") is None
    assert is_prerelease("2.1.0a0+git1234") and is_prerelease("2.6.0.dev20241001") and is_prerelease("2.0.0rc1")
    assert not is_prerelease("2.6.0+cu124") and not is_prerelease("unknown")


def test_the_two_requirement_parsers():
    # a package's Requires-Dist line: name (normalised), specifier set, marker
    assert parse_requires_dist('torch (>=2.0.0) ; extra == "torch"') == ("torch", ">=2.0.0", 'extra == "torch"')
    assert parse_requires_dist("Flash_Attn>=2.1,<3") == ("flash-attn", ">=2.1,<3", "")
    assert parse_requires_dist("peft; extra == 'dev'") == ("peft", "", "extra == 'dev'")
    # a requirement as a message words it: the first clause
    assert parse_message_requirement("accelerate>=0.20.1") == ("accelerate", ">=", "0.20.1")
    assert parse_message_requirement("tokenizers>=0.14,<0.19") == ("tokenizers", ">=", "0.14")
    assert parse_message_requirement(">= 2.1") == (None, ">=", "2.1")
    assert parse_message_requirement("no requirement here") is None


@pytest.mark.parametrize("number, cuda", [
    # 1000*major + 10*minor: driver API, NVML, CUDA_VERSION
    ("11040", "11.4"), ("12020", "12.2"), ("9000", "9.0"), ("6050", "6.5"), ("10010", "10.1"), ("10020", "10.2"),
    (12040, "12.4"), (11000, "11.0"),
    # MMmm, as torch and xformers print a build's CUDA
    ("1201", "12.1"), ("1108", "11.8"), (1201, "12.1"), ("1000", "10.0"),
    # the digits of a wheel tag (cu121)
    ("121", "12.1"), ("118", "11.8"), ("92", "9.2"), ("102", "10.2"), (130, "13.0"),
    # not a CUDA number
    ("0", None), ("7", None), ("abc", None), ("", None), (None, None), ("-11040", None), ("123456", None),
])
def test_one_cuda_number_decoder(number, cuda):
    assert cuda_int_to_str(number) == cuda


@pytest.mark.parametrize("value, version", [
    ("(8, 9, 2)", "8.9.2"), ("7102", "7.1.2"), (8902, "8.9.2"), ("90100", "9.1.0"), (None, None), ("x", None),
])
def test_cudnn_numbers(value, version):
    assert cudnn_version(value) == version


# --- byte sizes --------------------------------------------------------------------


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (80, "80 B"), (1023, "1023 B"), (4096, "4.00 KiB"), (612.38 * 1024**2, "612.38 MiB"),
    (int(1.53 * 1024**3), "1.53 GiB"), (2 * 1024**3, "2.00 GiB"), (23.6 * 1024**3, "23.60 GiB"),
    (8 * 1024**4, "8192.00 GiB"), (20 * 1000**4, "18626.45 GiB"), (-2 * 1024**2, "-2.00 MiB"), (None, None),
])
def test_one_byte_formatter(n, text):
    assert gib(n) == text


@pytest.mark.parametrize("text, n", [
    ("Tried to allocate 2.00 GiB", 2 * 1024**3), ("20.00 MiB", 20 * 1024**2), ("512 bytes", 512),
    ("3 GB", 3 * 1000**3), ("1.5 KiB", 1536), ("no size", None), (None, None),
])
def test_one_size_parser(text, n):
    assert parse_size(text) == n


def test_sizes_round_trip():
    for n in (1024, 5 * 1024**2, 3 * 1024**3):
        assert parse_size(gib(n)) == n


# --- signals -----------------------------------------------------------------------


def test_signal_names():
    assert signal_name(9) == "SIGKILL"
    assert signal_name(15) == "SIGTERM"
    assert signal_name(77) == "signal 77"


# --- dtypes ------------------------------------------------------------------------


@pytest.mark.parametrize("spelling, name", [
    ("Half", "float16"), ("c10::Half", "float16"), ("struct c10::Half", "float16"), ("class c10::Half", "float16"),
    ("at::Half", "float16"), ("torch.float16", "float16"), ("c10::BFloat16", "bfloat16"),
    ("c 10::BFloat16", "bfloat16"), ("float", "float32"), ("Float", "float32"), ("'Half'", "float16"),
    ("double", "float64"), ("Float8_e4m3fn", "float8_e4m3fn"), ("Long", "int64"), ("ComplexHalf", "complex32"),
    ("torch.cuda.HalfTensor", "float16"), ("torch.BFloat16Tensor", "bfloat16"), ("CUDAHalfType", "float16"),
    # a dtype torch adds later keeps its name
    ("Float8_e8m0fnu", "float8_e8m0fnu"), ("torch.uint16", "uint16"),
    # not dtypes
    ("cuda:0", None), ("weight", None), ("torch.Size", None), ("", None), (None, None),
])
def test_dtype_spellings_normalise(spelling, name):
    assert dtype_name(spelling) == name


def test_tensor_type_names_carry_dtype_and_device():
    assert tensor_type("torch.cuda.HalfTensor") == ("float16", "cuda")
    assert tensor_type("torch.FloatTensor") == ("float32", "cpu")
    assert tensor_type("CUDABFloat16Type") == ("bfloat16", "cuda")
    assert tensor_type("MPSFloatType") == ("float32", "mps")
    assert tensor_type("float") is None  # a dtype, not a tensor type


def test_every_torch_dtype_object_gets_its_printed_name():
    torch = pytest.importorskip("torch")
    dtypes = {v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    assert torch.float16 in dtypes and len(dtypes) > 20
    for dt in dtypes:
        assert dtype_name(dt) == str(dt).removeprefix("torch."), dt


def test_the_instrumentation_imports_stay_cheap():
    """dtypes, units and signals load in the user's training process: no tables, no packaging."""
    code = ("import sys\n"
            "import mpdoctor.knowledge.dtypes, mpdoctor.knowledge.units, mpdoctor.knowledge.signals\n"
            "print(sorted(m for m in ('packaging', 'tomllib', 'tomli', 'mpdoctor.knowledge.compat') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stderr


def test_versions_imports_packaging_only_when_comparing():
    code = ("import sys\n"
            "from mpdoctor.knowledge import versions\n"
            "versions.release('2.1'); versions.cuda_int_to_str('1201'); versions.parse_message_requirement('a>=1')\n"
            "print('packaging' in sys.modules)\n"
            "versions.compare('2.1', '2.0')\n"
            "print('packaging' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["False", "True"], proc.stderr
