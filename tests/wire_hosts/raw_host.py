"""A wire-protocol host written from docs/PROTOCOL.md alone: standard library only, no kvsched,
no kvsched_host helper. A deliberately simple scheduler: one request at a time, FCFS.

    python raw_host.py [--bug overbudget|crash|hang|garbage]
"""

import json
import sys
import time

BUG = sys.argv[sys.argv.index("--bug") + 1] if "--bug" in sys.argv else None


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


def main():
    engine = Engine()
    out = sys.stdout
    for line in sys.stdin:
        msg = json.loads(line)
        method, params = msg["method"], msg.get("params", {})
        if BUG == "crash" and method == "schedule" and engine.step == 2:
            sys.stderr.write("raw host: simulated crash\n")
            sys.exit(3)
        if BUG == "hang" and method == "schedule" and engine.step == 2:
            time.sleep(3600)
        if BUG == "garbage" and method == "schedule" and engine.step == 2:
            out.write("this is not json\n")
            out.flush()
            engine.step += 1
            continue
        if method == "hello":
            result = {"protocol": 1, "name": "raw", "profiles": ["safety"],
                      "capabilities": ["output", "statuses", "queues"]}
        elif method == "reset":
            result = engine.reset(params["config"])
        elif method == "add_request":
            result = engine.add(params["request"])
        elif method == "abort_request":
            result = engine.abort(params["request_id"])
        elif method == "schedule":
            result = engine.schedule()
        elif method == "update":
            result = engine.update(set(params["stopped"]))
        elif method == "snapshot":
            result = engine.snapshot()
        elif method == "shutdown":
            out.write(json.dumps({"id": msg["id"], "result": None}) + "\n")
            out.flush()
            return
        else:
            out.write(json.dumps({"id": msg["id"], "error": {"message": f"unknown method {method}"}}) + "\n")
            out.flush()
            continue
        out.write(json.dumps({"id": msg["id"], "result": result}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
