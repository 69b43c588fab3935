"""A slow, obviously-correct simulator for the tests: relax start times until nothing moves.

Every action's end is ``max(previous action on its rank, inputs + t_comm across ranks) +
duration``; iterating that rule to a fixed point (a longest-path computation, O(N^2)) gives the
same ASAP times as the event-driven simulator without sharing any of its code.
"""

from __future__ import annotations

from nobubble.pipeline.actions import Op


def reference_times(schedule, costs):
    """{action: (start, end)} for a valid schedule (raises if it never settles)."""
    S = schedule.num_stages
    where = {}
    for r, acts in enumerate(schedule.rank_actions):
        for a in acts:
            where[(a.stage, a.op, a.microbatch)] = (r, a)
    end = {key: 0.0 for key in where}
    start = {key: 0.0 for key in where}

    def inputs(a):
        s, i = a.stage, a.microbatch
        if a.op is Op.F:
            return [(s - 1, Op.F, i)] if s > 0 else []
        if a.op is Op.W:
            return [(s, Op.B, i)]
        own = [(s, Op.F, i)]
        if s == S - 1:
            return own
        nxt = (s + 1, Op.B, i) if (s + 1, Op.B, i) in where else (s + 1, Op.BW, i)
        return own + [nxt]

    def dur(a):
        t = {Op.F: costs.t_f, Op.B: costs.t_b, Op.W: costs.t_w}
        if a.op is Op.BW:
            return costs.t_b[a.stage] + costs.t_w[a.stage]
        return t[a.op][a.stage]

    for _ in range(len(where) + 2):
        changed = False
        for r, acts in enumerate(schedule.rank_actions):
            prev_end = 0.0
            for a in acts:
                t = prev_end
                for key in inputs(a):
                    comm = costs.t_comm if where[key][0] != r else 0.0
                    t = max(t, end[key] + comm)
                k = (a.stage, a.op, a.microbatch)
                if (t, t + dur(a)) != (start[k], end[k]):
                    start[k], end[k] = t, t + dur(a)
                    changed = True
                prev_end = end[k]
        if not changed:
            return {where[k][1]: (start[k], end[k]) for k in where}
    raise AssertionError("reference simulation did not settle (deadlock?)")
