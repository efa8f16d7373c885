#!/usr/bin/env python3
"""Data parallelism on CPU ranks under mpirun (OpenMPI), end to end with the tiny GLM and
tokenizer of test_train.py:
  - N ranks x micro-batch B reproduce 1 rank x micro-batch N*B (losses within 1e-6 relative
    over 20 steps) for 2 and 4 ranks, ZeRO stages 0/1/2, with and without accumulation, with
    small gradient buckets (many buckets; ZeRO-2 pieces cut by shard edges);
  - a checkpoint written by 2 ranks (ZeRO-2) resumes on 1 and on 4 ranks on the same curve;
  - a hung rank (SIGSTOP) makes rank 0 fail within --ddp_timeout naming the collective and
    step; a killed rank (SIGKILL) makes the others exit within it too;
  - `--nproc_per_node 2` starts the ranks itself (mpirun underneath), and Ctrl-C to it with
    --save_on_interrupt stops every worker after writing a checkpoint;
  - a torchrun environment on CPU without MPI is a clear error.
Prints PASS/FAIL/SKIP lines; SKIP when mpirun or an MPI build is missing."""
import json, os, re, shutil, signal, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_train as T

from mpi_runs import ENV, GLM, MPIRUN, losses, probe, rel, report, run, st_read


def wait_for(path, text, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return True
        time.sleep(0.05)
    return False


def rank_pid(out, r):
    for line in open(os.path.join(out, "logs", "rank-%d.log" % r), errors="replace"):
        if " pid " in line:
            return int(line.split(" pid ")[1].split(")")[0])
    return None


def still_running(pid, grace=3.0):
    """True when pid is still a live process (not a zombie) after grace seconds."""
    t0 = time.time()
    while time.time() - t0 < grace:
        try:
            state = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state == "Z":
            return False
        time.sleep(0.05)
    return True


def main():
    why = T.parallel_missing()
    if why:
        print("SKIP dp_all: " + why)
        return
    d = tempfile.mkdtemp(prefix="glmtrain-dp-")
    try:
        cfg, base = T.parallel_setup(d)
        steps20 = ["--max_steps", "20", "--save_steps", "10"]

        if not probe(base + ["--output_dir", os.path.join(d, "probe"), "--max_steps", "1", "--save_strategy", "no"],
                     "dp_all", "2-rank probe"):
            return

        # 1. N ranks x B == 1 rank x N*B, for every ZeRO stage, with and without accumulation
        ref = {}
        for acc in (1, 2):
            out = os.path.join(d, "ref-acc%d" % acc)
            run(base + steps20 + ["--output_dir", out, "--per_device_train_batch_size", "8",
                                  "--gradient_accumulation_steps", str(acc)])
            ref[acc] = losses(out)
        for np_ in (2, 4):
            for acc in (1, 2):
                for zero in (0, 1, 2):
                    out = os.path.join(d, "dp%d-acc%d-z%d" % (np_, acc, zero))
                    bucket = "0.004" if zero == 2 else "0.02"  # ~1000 / ~5000 fp32 per bucket
                    p = run(base + steps20 + ["--output_dir", out, "--per_device_train_batch_size", str(8 // np_),
                                              "--gradient_accumulation_steps", str(acc), "--zero_stage", str(zero),
                                              "--bucket_size_mb", bucket], np=np_)
                    err, n = rel(losses(out), ref[acc])
                    report("dp_%dranks_zero%d_accum%d_matches_1rank" % (np_, zero, acc), n == 20 and err < 1e-6,
                           "max relative loss difference %.2e over %d steps" % (err, n))
        # ZeRO-2 with an untied head (the head and the embedding are separate staging units), with
        # accumulation; the log states the gradient memory per rank
        untied = os.path.join(d, "config-untied.json")
        c2 = json.load(open(cfg))
        c2["tie_word_embeddings"] = False
        json.dump(c2, open(untied, "w"))
        ub = [x if x != cfg else untied for x in base]
        out = os.path.join(d, "untied-ref")
        run(ub + steps20 + ["--output_dir", out, "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2"])
        want_l = losses(out)
        out = os.path.join(d, "untied-z2")
        p = run(ub + steps20 + ["--output_dir", out, "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
                                "--zero_stage", "2"], np=2)
        err, n = rel(losses(out), want_l)
        mem = re.search(r"ZeRO-2: gradients ([0-9.]+) MiB per rank \(shard ([0-9.]+) \+ staging ([0-9.]+)\) instead of ([0-9.]+)",
                        p.stdout + p.stderr)
        report("dp_2ranks_zero2_untied_accum2_matches_1rank", n == 20 and err < 1e-6 and mem is not None
               and abs(float(mem.group(2)) * 2 - float(mem.group(4))) <= 0.1 + 1e-9,
               "max relative loss difference %.2e over %d steps; %s" % (err, n, mem.group(0) if mem else "no ZeRO-2 memory line"))

        # ZeRO-0 with each bucket's all-gather right after its reduce-scatter (an experiment
        # switch): the same numbers
        out = os.path.join(d, "z0-ag-backward")
        run(base + steps20 + ["--output_dir", out, "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
                              "--zero_stage", "0", "--bucket_size_mb", "0.02"], np=2, env={"GLMTRAIN_DP_Z0_AG_BACKWARD": "1"})
        err, n = rel(losses(out), ref[2])
        report("dp_2ranks_zero0_allgather_in_backward_matches_1rank", n == 20 and err < 1e-6,
               "max relative loss difference %.2e over %d steps" % (err, n))

        # the optimizer state that ZeRO ranks gather for a checkpoint is the one-rank state, tensor
        # by tensor (each rank's shard is one piece of every bucket: a wrong placement shows here)
        want = st_read(os.path.join(d, "ref-acc1", "checkpoint-10", "optimizer.safetensors"))
        for run_name in ("dp2-acc1-z1", "dp4-acc1-z2"):
            got = st_read(os.path.join(d, run_name, "checkpoint-10", "optimizer.safetensors"))
            worst, where = 0.0, ""
            for name, ref_v in want.items():
                g = got.get(name)
                scale = max(max(abs(x) for x in ref_v), 1e-30)
                e = float("inf") if g is None or len(g) != len(ref_v) else max(abs(a - b) for a, b in zip(g, ref_v)) / scale
                if e > worst: worst, where = e, name
            report("zero_checkpoint_state_matches_1rank_%s" % run_name, len(got) == len(want) and worst < 1e-4,
                   "%d tensors, worst max-abs difference / max-abs %.2e (%s)" % (len(want), worst, where))

        # the run above logged every rank's figures and wrote the other ranks' logs
        out = os.path.join(d, "dp4-acc2-z2")
        report("dp_rank_logs_and_stats", all(os.path.exists(os.path.join(out, "logs", "rank-%d.log" % r)) for r in (1, 2, 3))
               and "ranks (fwd+bwd s" in p.stderr and not os.path.exists(os.path.join(out, "logs", "rank-0.log")),
               p.stderr[-300:])

        # 2. a checkpoint of 2 ranks (ZeRO-2) continues on 1 rank and on 4 ranks (ZeRO-1)
        src = os.path.join(d, "dp2-acc1-z2")
        full = losses(src)
        for np_, zero in ((1, 0), (4, 1)):
            out = os.path.join(d, "resume-%d" % np_)
            os.makedirs(out)
            shutil.copytree(os.path.join(src, "checkpoint-10"), os.path.join(out, "checkpoint-10"))
            run(base + steps20 + ["--output_dir", out, "--per_device_train_batch_size", str(8 // np_),
                                  "--zero_stage", str(zero), "--resume_from_checkpoint"], np=np_)
            got = {s: l for s, l in losses(out).items() if s > 10}
            err, n = rel(got, full)
            report("checkpoint_of_2_ranks_resumes_on_%d" % np_, n == 10 and err < 1e-6,
                   "steps 11-20: max relative loss difference %.2e over %d steps" % (err, n))

        # 3. faults: a hung rank, a killed rank
        long_run = base + ["--max_steps", "1000000", "--save_strategy", "no", "--per_device_train_batch_size", "4",
                           "--logging_steps", "100", "--ddp_timeout", "4"]
        for how, sig in (("hung", signal.SIGSTOP), ("killed", signal.SIGKILL)):
            out = os.path.join(d, "fault-" + how)
            log = os.path.join(d, "fault-%s.txt" % how)
            with open(log, "w") as f:
                p = subprocess.Popen(MPIRUN + ["-np", "2", GLM, "train"] + long_run + ["--output_dir", out],
                                     stdout=f, stderr=subprocess.STDOUT, env=ENV)
            ok = wait_for(log, "'loss'") and wait_for(os.path.join(out, "logs", "rank-1.log"), "'loss'")
            pid = rank_pid(out, 1) if ok else None
            if pid is None:
                p.kill(); p.wait()
                report("fault_%s_rank" % how, False, "training did not start: " + open(log).read()[-800:])
                continue
            os.kill(pid, sig)
            t0 = time.time()
            try:
                rc = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill(); rc = p.wait()
            dt = time.time() - t0
            text = open(log, errors="replace").read()
            if how == "hung":  # the survivor names the stopped rank, and it is not left behind
                ok = "rank 0: " in text and "timed out after 4 s waiting for peers" in text and "at step" in text and \
                    ("rank 1 (pid %d" % pid) in text and "stopped (SIGSTOP or a debugger): killed" in text
                def alive():  # a zombie waiting for its reaper counts as gone
                    try:
                        return open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] != "Z"
                    except OSError:
                        return False
                t1 = time.time()
                while alive() and time.time() - t1 < 5:
                    time.sleep(0.1)
                ok = ok and not alive()  # not left behind after mpirun returned
            else:  # mpirun itself stops the survivors at once: they say where they were
                ok = "rank 0: " in text and "at step" in text and ("interrupted by SIGTERM" in text or "timed out" in text)
            if sig == signal.SIGSTOP:  # a safety net when the check above failed
                try: os.kill(pid, signal.SIGKILL)
                except ProcessLookupError: pass
            lines = [l for l in text.splitlines() if "rank 0:" in l or "behind this rank" in l]
            report("fault_%s_rank" % how, rc != 0 and dt < 4 + 3 and ok, "exit %d after %.1f s: %s" % (rc, dt, lines[:2]))

        # 4. own launcher (mpirun underneath), Ctrl-C with --save_on_interrupt
        out = os.path.join(d, "launcher")
        log = os.path.join(d, "launcher.txt")
        with open(log, "w") as f:
            p = subprocess.Popen([GLM, "train"] + long_run + ["--output_dir", out, "--nproc_per_node", "2",
                                                            "--save_on_interrupt"], stdout=f, stderr=subprocess.STDOUT, env=ENV)
        started = wait_for(log, "'loss'") and wait_for(os.path.join(out, "logs", "rank-1.log"), "'loss'")
        pids = [rank_pid(out, 1)] if started else []
        p.send_signal(signal.SIGINT)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill(); rc = p.wait()
        text = open(log, errors="replace").read()
        cks = [n for n in os.listdir(out) if n.startswith("checkpoint-")] if os.path.isdir(out) else []
        complete = len(cks) == 1 and os.path.exists(os.path.join(out, cks[0], "trainer_state.json"))
        alive = [q for q in pids if q and still_running(q)]
        report("launcher_ctrl_c_saves_and_stops_workers",
               started and rc != 0 and complete and not alive and "CPU ranks through" in text and "stopping at step" in text,
               "exit %d, checkpoints %s, workers alive %s: %s" % (rc, cks, alive, text[-400:]))

        # 4b. one process, Ctrl-C with --save_on_interrupt: the checkpoint holds the last completed
        # step and its data cursor, so resuming reproduces an uninterrupted run bit for bit
        const = ["--lr_scheduler_type", "constant_with_warmup", "--per_device_train_batch_size", "4",
                 "--save_strategy", "no", "--logging_steps", "1"]
        out = os.path.join(d, "sigint1")
        log = os.path.join(d, "sigint1.txt")
        with open(log, "w") as f:
            p = subprocess.Popen([GLM, "train"] + base + const + ["--output_dir", out, "--max_steps", "1000000",
                                                                  "--save_on_interrupt"], stdout=f, stderr=subprocess.STDOUT, env=ENV)
        wait_for(log, "'step': 5,")
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
        cks = [n for n in os.listdir(out) if n.startswith("checkpoint-")]
        k = int(cks[0].split("-")[1]) if len(cks) == 1 else 0
        ok = rc != 0 and k >= 5 and "checkpoint saved" in open(log).read()
        if ok:
            ref_out, res_out = os.path.join(d, "sigint1-ref"), os.path.join(d, "sigint1-resumed")
            run(base + const + ["--output_dir", ref_out, "--max_steps", str(k + 4), "--save_steps", str(k + 4),
                                "--save_strategy", "steps"])
            os.makedirs(res_out)
            shutil.copytree(os.path.join(out, cks[0]), os.path.join(res_out, cks[0]))
            run(base + const + ["--output_dir", res_out, "--max_steps", str(k + 4), "--save_steps", str(k + 4),
                                "--save_strategy", "steps", "--resume_from_checkpoint"])
            a, b = losses(ref_out, k + 4), losses(res_out, k + 4)
            ok = all(a[s] == b[s] for s in range(k + 1, k + 5))
        report("single_process_ctrl_c_checkpoint_resumes_exactly", ok, "exit %d, checkpoints %s" % (rc, cks))

        # 5. torchrun's variables on CPU ranks without MPI: a clear error, not a hang
        env = {k: v for k, v in ENV.items() if not k.startswith(("OMPI_", "PMIX_"))}
        env.update(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29555")
        p = subprocess.run([GLM, "train"] + base + ["--output_dir", os.path.join(d, "trx"), "--max_steps", "1", "--device", "cpu"],
                           capture_output=True, text=True, timeout=60, env=env)
        report("torchrun_env_on_cpu_is_clear_error", p.returncode != 0 and "communicate through MPI" in p.stderr,
               p.stderr.strip()[-300:])
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    import mpi_runs
    mpi_runs.main_of("test_dp", main)
