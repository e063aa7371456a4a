"""A wire-protocol host written from docs/PROTOCOL.md alone: standard library only, no kvsched,
no kvsched_host helper. A deliberately simple scheduler: one request at a time, FCFS.

    python raw_host.py [--bug overbudget|crash|hang|garbage|door] [--protocol 1]
"""

import json
import sys
import time

BUG = sys.argv[sys.argv.index("--bug") + 1] if "--bug" in sys.argv else None
PROTOCOL = int(sys.argv[sys.argv.index("--protocol") + 1]) if "--protocol" in sys.argv else 2  # 1: an old host


class Engine:
    def reset(self, config):
        self.c = config
        self.waiting, self.current, self.status, self.step = [], None, {}, 0
        self.pending, self.ignored, self.requests = None, [], {}

    def add(self, r):
        c = self.c
        if BUG == "door" and (r["prompt_len"] > min(c["max_model_len"], c["max_num_batched_tokens"])
                              or r["n"] > c["max_num_seqs"]):
            self.status[r["id"]] = "FINISHED_IGNORED"  # refused at the door: never queued
            self.requests[r["id"]] = dict(r, live=[], seqs={})
            return {"request": r["id"], "status": "FINISHED_IGNORED"}
        r = dict(r, done=0, live=[f"{r['id']}#0"], prefilled=False, lens={}, seqs={f"{r['id']}#0": "WAITING"})
        self.waiting.append(r)
        self.requests[r["id"]] = r
        self.status[r["id"]] = "WAITING"

    def abort(self, rid):
        if self.status.get(rid) not in ("WAITING", "RUNNING"):
            return None
        self.waiting = [r for r in self.waiting if r["id"] != rid]
        if self.current and self.current["id"] == rid:
            self.current = None
        self.status[rid] = "FINISHED_ABORTED"
        return {"request": rid, "status": "FINISHED_ABORTED"}

    def schedule(self):
        c, out = self.c, {"step": self.step, "scheduled": [], "preempted": [], "ignored": []}
        self.step += 1
        limit = min(c["max_model_len"], c["max_num_batched_tokens"])
        while self.current is None and self.waiting:
            r = self.waiting.pop(0)
            if r["prompt_len"] > limit or r["n"] > c["max_num_seqs"]:
                self.status[r["id"]] = "FINISHED_IGNORED"
                out["ignored"].append(r["id"])
                self.ignored.append({"request": r["id"], "status": "FINISHED_IGNORED"})
                continue
            self.current = r
            self.status[r["id"]] = "RUNNING"
        r = self.current
        if r is not None:
            if not r["prefilled"]:
                tokens = r["prompt_len"] + (5 * c["max_num_batched_tokens"] if BUG == "overbudget" else 0)
                out["scheduled"] = [{"seq": r["live"][0], "request": r["id"], "tokens": tokens, "prefill": True}]
            else:
                out["scheduled"] = [{"seq": s, "request": r["id"], "tokens": 1, "prefill": False} for s in r["live"]]
        self.pending = out
        return out

    def update(self, stopped):
        finished, self.ignored = self.ignored, []
        r, out, self.pending = self.current, self.pending, None
        if r is None or out is None or not out["scheduled"]:
            return finished
        if not r["prefilled"]:
            r["prefilled"] = True
            r["live"] = [f"{r['id']}#{i}" for i in range(r["n"])]
            r["lens"] = {s: r["prompt_len"] for s in r["live"]}
        capped = True
        for s in list(r["live"]):
            r["lens"][s] += 1
            generated = r["lens"][s] - r["prompt_len"]
            if s in stopped:
                r["live"].remove(s)
                r["seqs"][s] = "FINISHED_STOPPED"
                capped = False
            elif generated >= r["max_tokens"] or r["lens"][s] >= self.c["max_model_len"]:
                r["live"].remove(s)
                r["seqs"][s] = "FINISHED_LENGTH_CAPPED"
            else:
                r["seqs"][s] = "RUNNING"
        r["capped"] = r.get("capped", True) and capped
        if not r["live"]:
            status = "FINISHED_LENGTH_CAPPED" if r["capped"] else "FINISHED_STOPPED"
            self.status[r["id"]] = status
            finished.append({"request": r["id"], "status": status})
            self.current = None
        return finished

    def snapshot(self):
        seqs = {}
        for rid, r in self.requests.items():
            for sid, status in r["seqs"].items():
                if self.status[rid] in ("WAITING", "RUNNING") and not status.startswith("FINISHED"):
                    status = self.status[rid]
                elif self.status[rid].startswith("FINISHED") and not status.startswith("FINISHED"):
                    status = self.status[rid]
                seqs[sid] = {"request": rid, "status": status}
        return {"statuses": self.status, "seqs": seqs, "waiting": [r["id"] for r in self.waiting],
                "running": [self.current["id"]] if self.current else [], "swapped": []}


class Garbage(Exception):
    """The --bug garbage host answers this call with a line that is not JSON."""


def call(engine, method, params):
    """One method of protocol 2 but `steps` (below): its result."""
    if BUG == "crash" and method == "schedule" and engine.step == 2:
        sys.stderr.write("raw host: simulated crash\n")
        sys.exit(3)
    if BUG == "hang" and method == "schedule" and engine.step == 2:
        time.sleep(3600)
    if BUG == "garbage" and method == "schedule" and engine.step == 2:
        engine.step += 1
        raise Garbage
    if method == "hello":
        return {"protocol": PROTOCOL, "name": "raw", "profiles": ["safety"], "capabilities": ["output", "statuses", "queues"]}
    if method == "reset":
        engine.unfinished = set()
        return engine.reset(params["config"])
    if method == "add_request":
        return engine.add(params["request"])
    if method == "abort_request":
        return engine.abort(params["request_id"])
    if method == "schedule":
        return engine.schedule()
    if method == "update":
        return engine.update(set(params["stopped"]))
    if method == "snapshot":
        return json.loads(json.dumps(engine.snapshot()))  # a copy: the engine's dicts change later
    raise KeyError(method)


def steps(engine, params, send):
    """The `steps` method as docs/PROTOCOL.md tells it: a line per step with its calls' results,
    then the closing result. Snapshots are sent whole (a delta is optional)."""
    observe, mid_step = params["observe"], params["mid_step"]
    for step in params["steps"]:
        calls, finished = [], []

        def run(method, args, calls=calls):
            result = call(engine, method, args)
            calls.append([method, result])
            return result

        for request in step["add"]:
            engine.unfinished.add(request["id"])
            refused = run("add_request", {"request": request})
            finished += [refused["request"]] if refused else []
        for rid in step["abort"]:
            done = run("abort_request", {"request_id": rid})
            finished += [done["request"]] if done else []
        if observe and (step["add"] or step["abort"] or step["step"] == 0):
            run("snapshot", {})
        run("schedule", {})
        if observe and mid_step:
            run("snapshot", {})
        finished += [f["request"] for f in run("update", {"stopped": step["stopped"]})]
        if observe:
            run("snapshot", {})
        send({"calls": calls})
        engine.unfinished -= set(finished)
        if step["step"] >= params["last_arrival_step"] and not engine.unfinished:
            return {"ended": True}
    return {"ended": False}


def main():
    engine = Engine()
    out = sys.stdout

    def send(msg):
        out.write(json.dumps(msg) + "\n")
        out.flush()

    for line in sys.stdin:
        msg = json.loads(line)
        method, params = msg["method"], msg.get("params", {})
        if method == "shutdown":
            send({"id": msg["id"], "result": None})
            return
        try:
            if method == "steps":
                result = steps(engine, params, lambda part, mid=msg["id"]: send({"id": mid, **part}))
            else:
                result = call(engine, method, params)
        except Garbage:
            out.write("this is not json\n")
            out.flush()
            continue
        except KeyError:
            send({"id": msg["id"], "error": {"message": f"unknown method {method}"}})
            continue
        send({"id": msg["id"], "result": result})


if __name__ == "__main__":
    main()
