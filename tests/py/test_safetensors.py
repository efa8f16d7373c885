"""safetensors interop between the C reader/writer (through tool_ckpt) and the Python
`safetensors` package: files written by Python read by C, files written by C (single and
sharded, raw and converted to F16/BF16) read by Python, bit for bit.

Prints PASS/FAIL/SKIP lines. Needs $GLM_BUILD/tests/tool_ckpt, numpy and safetensors; torch is
used for BF16 when present."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

BUILD = harness.BUILD
TOOL = harness.tool("tool_ckpt")
_checks = harness.Checks()
check = _checks.check


def run(*args):
    return subprocess.run([TOOL, *args], capture_output=True, text=True, errors="replace")


def dump(fmt, path):
    """tool_ckpt dump -> {name: (dtype, shape, payload bytes)}; raises with stderr on failure."""
    out = run("dump", fmt, path)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    res = {}
    for line in out.stdout.splitlines():
        name, dt, shape, hexs = line.split("\t")
        res[name] = (dt, tuple(int(x) for x in shape.split(",")) if shape else (), bytes.fromhex(hexs))
    return res


def same_f32(payload, ref):
    """payload: float32 bits from C; ref: the expected values. Equal bits, or both NaN."""
    got = np.frombuffer(payload, dtype="<f4")
    ref = np.ascontiguousarray(ref, dtype=np.float32).reshape(-1)
    if got.shape != ref.shape:
        return False
    nan = np.isnan(got) & np.isnan(ref)
    return bool(np.all((got.view(np.uint32) == ref.view(np.uint32)) | nan))


def sample_arrays(rng):
    specials = np.array([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 1e-42, 65504, 65520, 1e-8, 3.4e38], np.float32)
    f32 = np.concatenate([specials, rng.standard_normal(36).astype(np.float32)]).reshape(4, 12)
    return {
        "model.f32": f32,
        "model.f16": (rng.standard_normal((3, 5)) * 100).astype(np.float16),
        "model.f64": rng.standard_normal(7),
        "model.i64": np.array([-1, 2**40, 7], np.int64),
        "model.i32": np.array([[1, -2], [3, 2**31 - 1]], np.int32),
        "model.i16": np.array([-300, 5], np.int16),
        "model.i8": np.array([-128, 127, 0], np.int8),
        "model.u8": np.arange(250, 256, dtype=np.uint8),
        "model.bool": np.array([True, False, True]),
        "model.scalar": np.array(3.5, np.float32),
        "model.empty": np.zeros((0, 4), np.float32),
    }


ST_NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.float64): "F64", np.dtype(np.int64): "I64",
            np.dtype(np.int32): "I32", np.dtype(np.int16): "I16", np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8",
            np.dtype(np.bool_): "BOOL"}


def check_dump(name, got, arrays, bf16=None):
    bad = []
    want_names = set(arrays) | set(bf16 or {})
    if set(got) != want_names:
        bad.append(f"names {sorted(got)} != {sorted(want_names)}")
    for k, a in arrays.items():
        if k not in got:
            continue
        dt, shape, payload = got[k]
        if dt != ST_NAMES[a.dtype] or shape != a.shape:
            bad.append(f"{k}: {dt}{shape} vs {ST_NAMES[a.dtype]}{a.shape}")
        elif a.dtype.kind == "f":
            if not same_f32(payload, a.astype(np.float32)):
                bad.append(f"{k}: values differ")
        elif payload != a.tobytes():
            bad.append(f"{k}: bytes differ")
    for k, (bits, shape) in (bf16 or {}).items():
        if k in got and (got[k][0] != "BF16" or got[k][1] != shape or
                         not same_f32(got[k][2], (bits.astype(np.uint32) << 16).view(np.float32))):
            bad.append(f"{k}: bf16 differs")
    check(name, not bad, "; ".join(bad[:4]))


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"SKIP st_python_interop: {TOOL} not built")
        return 0
    try:
        import safetensors.numpy as stn
        from safetensors import safe_open
    except ImportError as e:
        print(f"SKIP st_python_interop: safetensors not importable ({e})")
        return 0
    try:
        import torch
        import safetensors.torch as stt
    except ImportError:
        torch = None
    rng = np.random.default_rng(7)
    arrays = sample_arrays(rng)
    with tempfile.TemporaryDirectory() as d:
        # 1. Python writes, C reads (single file).
        py_file = os.path.join(d, "py.safetensors")
        stn.save_file(arrays, py_file, metadata={"format": "pt"})
        check_dump("st_c_reads_python_file", dump("st", py_file), arrays)
        bf16 = {}
        if torch is not None:
            t = torch.tensor(rng.standard_normal(10).astype(np.float32)).to(torch.bfloat16).reshape(2, 5)
            bf16["model.bf16"] = (t.view(torch.int16).numpy().view(np.uint16), (2, 5))
            stt.save_file({"model.bf16": t}, os.path.join(d, "bf16.safetensors"))
            check_dump("st_c_reads_python_bf16", dump("st", os.path.join(d, "bf16.safetensors")), {}, bf16)
        else:
            print("SKIP st_c_reads_python_bf16: torch not importable")

        # 2. Python writes shards + index (HF layout), C reads through the index.
        sd = os.path.join(d, "pyshards")
        os.mkdir(sd)
        names = sorted(arrays)
        halves = [names[: len(names) // 2], names[len(names) // 2:]]
        wm = {}
        for i, part in enumerate(halves):
            fn = f"model-{i + 1:05d}-of-00002.safetensors"
            stn.save_file({k: arrays[k] for k in part}, os.path.join(sd, fn), metadata={"format": "pt"})
            wm.update({k: fn for k in part})
        with open(os.path.join(sd, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f)
        check_dump("st_c_reads_python_shards", dump("st", sd), arrays)

        # 3. C writes (raw copy), Python reads: single, sharded.
        c_file = os.path.join(d, "c.safetensors")
        out = run("copy", "st", py_file, c_file, "0")
        ok = out.returncode == 0
        loaded = stn.load_file(c_file) if ok else {}
        same = ok and set(loaded) == set(arrays) and all(
            loaded[k].dtype == a.dtype and loaded[k].shape == a.shape and loaded[k].tobytes() == a.tobytes() for k, a in arrays.items())
        check("st_python_reads_c_file", same, out.stderr)
        with safe_open(c_file, framework="numpy") as f:
            check("st_c_file_metadata_format_pt", (f.metadata() or {}).get("format") == "pt", f.metadata())
        cd = os.path.join(d, "cshards")
        out = run("copy", "st", py_file, cd, "64")
        files = sorted(os.listdir(cd)) if out.returncode == 0 else []
        index = json.load(open(os.path.join(cd, "model.safetensors.index.json"))) if "model.safetensors.index.json" in files else {}
        loaded = {}
        for fn in set(index.get("weight_map", {}).values()):
            loaded.update(stn.load_file(os.path.join(cd, fn)))
        total = sum(a.nbytes for a in arrays.values())
        same = set(loaded) == set(arrays) and all(loaded[k].tobytes() == a.tobytes() and loaded[k].shape == a.shape for k, a in arrays.items())
        check("st_python_reads_c_shards", out.returncode == 0 and len(files) > 2 and same and
              index["metadata"]["total_size"] == total and not any(f.endswith(".tmp") for f in files),
              f"{out.stderr} files={files}")

        # 4. C converts float32 -> F16 / BF16; must equal numpy's / torch's round-to-nearest-even.
        f32 = {"x": np.concatenate([arrays["model.f32"].reshape(-1), rng.standard_normal(1000).astype(np.float32) * 1000,
                                    (np.arange(-2000, 2000, dtype=np.float32) + 0.5) * np.float32(2.0 ** -12)]).astype(np.float32)}
        src = os.path.join(d, "f32.safetensors")
        stn.save_file(f32, src)
        # finite values float16 cannot hold (65520, 3.4e38) are refused by the writer (they would be
        # written as inf); the F16 comparison takes the rest, infinities and NaN included
        x = f32["x"]
        fits = {"x": x[~(np.isfinite(x) & (np.abs(x) >= 65520))]}
        src16 = os.path.join(d, "f32_fits_f16.safetensors")
        stn.save_file(fits, src16)
        out = run("copy", "st", src, os.path.join(d, "conv_refused.safetensors"), "0", "F16")
        check("st_c_refuses_f16_overflow", out.returncode != 0 and "past float16's range" in out.stderr and
              not os.path.exists(os.path.join(d, "conv_refused.safetensors")), out.stderr[-300:])
        for dt in ("F16", "BF16"):
            dst = os.path.join(d, f"conv_{dt}.safetensors")
            out = run("copy", "st", src16 if dt == "F16" else src, dst, "0", dt)
            if out.returncode != 0:
                check(f"st_c_converts_{dt}_like_python", False, out.stderr)
                continue
            if dt == "F16":
                with np.errstate(over="ignore"):
                    got, want = stn.load_file(dst)["x"], fits["x"].astype(np.float16)
                same = got.dtype == np.float16 and np.array_equal(got.view(np.uint16)[~np.isnan(want)], want.view(np.uint16)[~np.isnan(want)])
                same = same and np.array_equal(np.isnan(got), np.isnan(want))
            elif torch is None:
                print("SKIP st_c_converts_BF16_like_python: torch not importable")
                continue
            else:
                got = stt.load_file(dst)["x"]
                want = torch.from_numpy(f32["x"]).to(torch.bfloat16)
                nan = torch.isnan(want)
                same = got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan]) and \
                    torch.equal(torch.isnan(got), nan)
            check(f"st_c_converts_{dt}_like_python", same, "bits differ from the Python conversion")

        # 5. A header that lies, written by hand: C names the file and the tensor.
        bad = os.path.join(d, "lies.safetensors")
        hdr = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}).encode()
        open(bad, "wb").write(len(hdr).to_bytes(8, "little") + hdr + bytes(16))
        out = run("dump", "st", bad)
        check("st_c_rejects_lying_header", out.returncode == 1 and bad in out.stderr and "'w'" in out.stderr, out.stderr)
    return _checks.status()


if __name__ == "__main__":
    sys.exit(main())
