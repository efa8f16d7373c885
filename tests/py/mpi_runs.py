"""What the multi-rank tests (test_dp.py, test_pipeline.py) share: running `glmtrain` under
mpirun on CPU ranks, reading a run's loss curve, comparing curves, and the PASS/FAIL lines
with the process's exit status."""
import array, json, os, struct, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_train as T

GLM = T.GLM
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive")
results = []


def report(name, ok, detail=""):
    detail = " | ".join(l.strip() for l in detail.strip().splitlines()[-3:])
    print(("PASS " if ok else "FAIL ") + name + (": " + detail if detail else ""))
    sys.stdout.flush()
    results.append(ok)


def losses(out, step=20):
    """Logged training loss by step, from checkpoint-<step>'s trainer state."""
    h = json.load(open(os.path.join(out, "checkpoint-%d" % step, "trainer_state.json")))["log_history"]
    return {r["step"]: r["loss"] for r in h if "loss" in r}


def run(args, np=1, check=True, timeout=120, env=None, cmd="train"):
    """glmtrain <cmd> args, on np ranks under mpirun when np > 1; env is added for every rank."""
    full = (MPIRUN + ["-np", str(np)] if np > 1 else []) + [GLM, cmd] + args
    if env and np > 1:  # mpirun passes only what -x names
        full = full[:len(MPIRUN)] + sum((["-x", "%s=%s" % kv] for kv in env.items()), []) + full[len(MPIRUN):]
    p = subprocess.run(full, capture_output=True, text=True, timeout=timeout, env=dict(ENV, **(env or {})))
    if check and p.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (" ".join(full[:10]), p.returncode, (p.stdout + p.stderr)[-3000:]))
    return p


NO_MPI = ("built without MPI", "not an MPI job", "no MPI job")


def probe(args, skip_name, what):
    """A short 2-rank run before the real ones: False (after printing the SKIP line) when this
    glmtrain cannot run MPI ranks; raises when it fails for another reason."""
    p = run(args, np=2, check=False)
    out = p.stdout + p.stderr
    if any(m in out for m in NO_MPI):
        print("SKIP %s: this glmtrain was built without MPI (MPI=0 or a CUDA build)" % skip_name)
        return False
    if p.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (what, out[-3000:]))
    return True


def rel(a, b, after=0):
    """Largest relative difference of two loss curves over their common steps > after, and how many."""
    steps = sorted(s for s in set(a) & set(b) if s > after)
    return (max(abs(a[s] - b[s]) / abs(b[s]) for s in steps) if steps else float("inf")), len(steps)


def main_of(name, main):
    """Runs main(); a crash is one failure with its reason; exits 1 when any check failed."""
    t0 = time.time()
    try:
        main()
    except Exception as e:
        print("FAIL %s: %s" % (name, e))
        sys.exit(1)
    print("# %s: %.0f s" % (name, time.time() - t0))
    sys.exit(0 if all(results) else 1)


def st_read(path, others=False):
    """The tensors of a safetensors file (u64 header size, JSON, data): F32 ones as flat lists;
    the others as their bytes when `others`, else left out."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in head.items():
        if name == "__metadata__" or (info["dtype"] != "F32" and not others):
            continue
        a, b = info["data_offsets"]
        out[name] = array.array("f", data[a:b]).tolist() if info["dtype"] == "F32" else data[a:b]
    return out


def logged(p, key):
    """The values of key in a run's log lines ({'key': value, ...}), in order."""
    import re
    return [float(x) for x in re.findall(r"'%s': (-?[0-9.naif]+)" % re.escape(key), p.stderr)]


def resume_equal(name, train, tmp, const):
    """train(out, extra) for 6 steps, and for 3 then 3 more from checkpoint-3: the same losses."""
    full, part = os.path.join(tmp, name + "_six"), os.path.join(tmp, name + "_three")
    p6 = train(full, ["--max_steps", "6"] + const)
    p3 = train(part, ["--max_steps", "3", "--save_strategy", "steps", "--save_steps", "3"] + const)
    pr = train(part, ["--max_steps", "6", "--resume_from_checkpoint", os.path.join(part, "checkpoint-3")] + const)
    if p3.returncode or pr.returncode or p6.returncode:
        report(name, False, (p3.stderr + pr.stderr + p6.stderr)[-600:])
    else:
        a, b = logged(p6, "loss"), logged(p3, "loss") + logged(pr, "loss")
        report(name, len(a) == 6 and a == b, "6 steps %s, 3 + resumed 3 %s" % (a, b))
    return p6


def ranks_equal(name, base, tmp, bs_one, bs_two, zero="1", steps=4):
    """base (a train command's flags saving checkpoint-<steps>) on 1 rank at micro-batch bs_one and on 2
    ranks at bs_two (ZeRO zero): the same loss curve within 1e-6; SKIP without MPI."""
    one = os.path.join(tmp, name + "_1")
    two_out = os.path.join(tmp, name + "_2")
    run(base + ["--output_dir", one, "--per_device_train_batch_size", str(bs_one)], check=False)
    two = run(base + ["--output_dir", two_out, "--per_device_train_batch_size", str(bs_two), "--zero_stage", zero],
              np=2, check=False, timeout=300)
    out = two.stdout + two.stderr
    if any(m in out for m in NO_MPI):
        print("SKIP %s: this glmtrain was built without MPI" % name)
        return
    try:
        a, b = losses(one, steps), losses(two_out, steps)
        e, n = rel(b, a)
    except Exception as ex:  # noqa: BLE001  (a run that failed has no checkpoint)
        a, b, e, n = {}, {}, float("inf"), 0
        out += str(ex)
    report(name, two.returncode == 0 and n == steps and e < 1e-6,
           "max rel %.1e over %d steps; 1 rank %s, 2 ranks %s %s" % (e, n, a, b, out[-300:] if two.returncode or n != steps else ""))
