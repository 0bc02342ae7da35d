"""Closed forms of a step run in microbatches: gradient accumulation, and pipeline stages (GPipe and
circular schedules) as ffn_model.pipeline compiles them. Notation: S stages, M microbatches, R repeats
(chunks per stage), L blocks, Lc = L/(S·R) blocks per chunk.

Bubble (two conventions; name the one you quote):
  idle share of the step (MaxText's config docs)       (S−1)/(R·M + S−1)
  overhead relative to the ideal step (Megatron-LM,     (S−1)/(R·M)   (Narayanan et al. 2021, eq. for
  Narayanan et al. 2021; interleaved: (S−1)/(v·M))                    the interleaved schedule, v = R)
The compiled schedule is one scan of T = R·M + S − 1 iterations in which every stage runs its chunk
every iteration: it EXECUTES T·Lc block-passes per stage, R·M·Lc of them on real microbatches and
(S−1)·Lc bubble passes on whatever the stage holds. So executed FLOPs are the useful ones times
T/(R·M) = 1 + (S−1)/(R·M): the Megatron overhead is paid in FLOPs here, not only in idle time, and
the bubble's activations are saved like the others (autodiff of the scan saves every iteration's).
Without a stage axis (S = 1) M microbatches are gradient accumulation: M passes of L blocks, one
microbatch's activations live at a time.
Uneven stages (L_s blocks on stage s, Σ L_s = L: Schedule.stage_blocks or the default rule): the program's stacks
are S·Lmax slots, Lmax = max L_s, every stage running its Lmax slots each iteration (the padding ones masked), so
every per-device term is that of an even stack of S·Lmax blocks (largest_stage, padding): the slowest stage's
pace is every stage's, in FLOPs executed, weights held and gathered; the useful FLOPs are L's.
Uneven chunks (circular and interleaved 1F1B, R > 1: n_c blocks in chunk c = r·S + s, chunk_counts): every chunk
padded to Cmax = max n_c slots, stage s holding R·Cmax (its chunks s, S + s, ...), each iteration running Cmax
(the padding ones masked, their FLOPs executed): the even terms of S·R·Cmax blocks, Lc = Cmax; the bubble with
the padding counted, padded_bubble.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from scaling.core.family import ModelFamily
from scaling.core.policies import Pipeline
from scaling.core.schedule import Schedule, pipeline_ends, saved_blocks


def iterations(schedule: Schedule, stages: int) -> int:
    """T, the loop trips of the compiled schedule: R·M + S − 1 with stages (S > 1; 1F1B: R·(M + S) + S − 2, a
    forward and a backward slot each, M + 2(S − 1) for R = 1: ffn_model.pipeline.one_f_one_b), M without."""
    M, R = schedule.microbatches, schedule.repeats
    if stages > 1 and schedule.pipeline == Pipeline.ONE_F_ONE_B:
        return R * (M + stages) + stages - 2
    return R * M + stages - 1 if stages > 1 else M


def slots(schedule: Schedule, stages: int) -> int:
    """The chunk forwards (and as many backwards) a stage runs per step: T (every iteration), but R·M + S − 1 for
    1F1B with warm-up phases, whose first and last R·S − 1 iterations run one slot each
    (ffn_model.pipeline.one_f_one_b); M without stages."""
    if stages > 1 and schedule.pipeline == Pipeline.ONE_F_ONE_B and schedule.warmup_phases:
        return schedule.repeats * schedule.microbatches + stages - 1
    return iterations(schedule, stages)


def head_iterations(schedule: Schedule, stages: int) -> int:
    """1F1B: the iterations that run the head: T, or with warm-up phases the steady phase's T − 2·(R·S − 1) =
    R·(M − S) + S (M for R = 1)."""
    if schedule.warmup_phases:
        return schedule.repeats * (schedule.microbatches - stages) + stages
    return iterations(schedule, stages)


def bubble(schedule: Schedule, stages: int) -> dict[str, float]:
    """{"idle_share": (S−1)/(R·M+S−1) (MaxText), "overhead": (S−1)/(R·M) (Megatron-LM)}; 1F1B as this package
    runs it, lock-step, a forward and a backward slot every iteration: 2(S−1)/(M+2(S−1)) and 2(S−1)/M (Megatron's
    1F1B idles (S−1)/M: its warm-up and cool-down slots are not paid by every stage); interleaved (R > 1), in
    chunk-iterations of L/(S·R) layers: (R·S + S − 2)/(R·M) (Megatron's (S−1)/(R·M), which 1F1B with warm-up
    phases reaches: its slots, R·M + S − 1)."""
    M, R, S = schedule.microbatches, schedule.repeats, stages
    idle = slots(schedule, S) - R * M
    return {"idle_share": idle / (R * M + idle), "overhead": idle / (R * M)}


def stage_blocks(cfg: ModelFamily, schedule: Schedule, stages: int) -> tuple[int, ...]:
    """L_s, the blocks of each stage (Schedule.blocks_per_stage: the explicit list, or the default rule
    scaling.core.schedule.default_stage_blocks; R > 1: the sums of its chunks'); (L,) without stages."""
    return schedule.blocks_per_stage(cfg.pipeline_blocks, stages, cfg)


def chunk_counts(cfg: ModelFamily, schedule: Schedule, stages: int) -> tuple[int, ...]:
    """n_c, the blocks of each chunk c = r·S + s (stage s's r-th) in the order the blocks run
    (Schedule.blocks_per_chunk); R = 1: stage_blocks; (L,) without stages."""
    return schedule.blocks_per_chunk(cfg.pipeline_blocks, stages, cfg)


def layout_text(counts: tuple[int, ...]) -> str:
    """Block counts with runs of one count written n*k (Megatron-LM's --pipeline-model-parallel-layout repeats a
    run with *): (3, 4, 4, 4, 3) -> "3,4*3,3"."""
    runs: list[list[int]] = []
    for n in counts:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ",".join(f"{n}*{k}" if k > 1 else f"{n}" for n, k in runs)


def largest_stage(cfg: ModelFamily, schedule: Schedule, stages: int) -> int:
    """The slots every stage holds in the program, whose stacks are S of them, a stage's unused slots padding
    (ffn_model.pipeline.padded_slots): R·Cmax, Cmax = max_c n_c the largest chunk (chunk_counts); R = 1: Lmax = max_s
    L_s; L/S for an even split, L without stages. The lock-step loop runs at the pace of the slowest chunk: Cmax
    blocks a chunk-iteration."""
    return schedule.repeats * max(chunk_counts(cfg, schedule, stages)) if stages > 1 else cfg.blocks


def padded_bubble(cfg: ModelFamily, schedule: Schedule, stages: int) -> dict[str, float]:
    """The bubble with uneven stages' or chunks' padding counted: each stage runs slots·Lc block-passes a step (its
    chunk-slots, bubble ones included, each Lc = Cmax blocks), where a step of balanced stages without a bubble runs
    M·L/S: {"overhead": slots·Lc·S/(M·L) − 1 (Megatron-LM's convention; for even chunks bubble's (S−1)/(R·M)),
    "idle_share": 1 − M·L/(S·slots·Lc) (the share of the step's block-passes that are bubble or padding),
    "padding": S·R·Cmax/L − 1 (padding's share alone)}; zeros without stages."""
    if stages == 1:
        return {"overhead": 0.0, "idle_share": 0.0, "padding": 0.0}
    M = schedule.microbatches
    run = slots(schedule, stages) * chunk_blocks(cfg, schedule, stages) * stages  # block-passes, all stages
    L = cfg.pipeline_blocks
    return {"overhead": run / (M * L) - 1, "idle_share": 1 - M * L / run,
            "padding": padding(cfg, schedule, stages) - 1}


def stage_loads(cfg: ModelFamily, schedule: Schedule, stages: int) -> tuple[int, ...]:
    """Each stage's work in blocks with the embedding counted as one block on the first stage and the output layer
    as one on the last where the model has them (Megatron-LM's account-for-embedding/loss-in-pipeline-split
    convention); the step of a stage-balanced pipeline is set by the largest (Narayanan et al. 2021: the slowest
    stage sets the pipeline's pace)."""
    loads = list(stage_blocks(cfg, schedule, stages))
    if pipeline_ends(cfg):
        loads[0] += 1
        loads[-1] += 1
    return tuple(loads)


def padding(cfg: ModelFamily, schedule: Schedule, stages: int) -> float:
    """S·Lmax/L: the stacks' slots over the real blocks (1 for an even split or without stages): the stage-sharded
    parameters, gradients and optimizer state a device holds are a 1/S share of S·Lmax slots (largest_stage)."""
    return stages * largest_stage(cfg, schedule, stages) / cfg.pipeline_blocks if stages > 1 else 1.0


def chunk_blocks(cfg: ModelFamily, schedule: Schedule, stages: int) -> int:
    """Lc: blocks a stage runs per iteration: Cmax, the largest chunk's (largest_stage/R; L/(S·R) for an even
    split); L without stages (one microbatch through all)."""
    return largest_stage(cfg, schedule, stages) // schedule.repeats if stages > 1 else cfg.blocks


def block_passes(cfg: ModelFamily, schedule: Schedule, stages: int) -> int:
    """Block-passes one device executes per step (forward): T·Lc (S > 1: bubble iterations included),
    M·L without stages."""
    return iterations(schedule, stages) * chunk_blocks(cfg, schedule, stages)


def saved_per_token(cfg: ModelFamily, mesh: Mapping, remat: str, schedule: Schedule, c: int = 2) -> float:
    """Bytes saved for backward per token of one microbatch, for the blocks one pass runs (a chunk of
    Lc with stages, all L without), under the remat policy (schedule.saved_blocks per chunk):
    c·[n_full·(D + F/Y) + n_input·D], D -> D/Y for the saved x under sequence parallelism."""
    Lc = chunk_blocks(cfg, schedule, mesh.get("stage", 1))
    n_full, n_input = saved_blocks(Lc, remat)
    Y = mesh.get("tensor", 1)
    x = cfg.d_model / Y if schedule.sequence_parallel else cfg.d_model  # sequence parallel: x split over tensor
    return c * (n_full * (x + cfg.d_ff / Y) + n_input * x)


def relay_rounds(stages: int, repeats: int) -> list[list[tuple[int, int, int, int]]]:
    """The circular schedule's re-lay of the stacked weights as rounds of point-to-point moves.

    Stage s stores blocks s·L/S .. (s+1)·L/S − 1, its R chunks j = 0..R−1 of Lc blocks: chunk c = s·R + j
    of the stack. A circular schedule needs chunk c on stage c mod S, as that stage's chunk c // S (stage
    s runs chunks s, S+s, 2S+s, ...). Every stage sends R chunks and receives R: an R-regular bipartite
    multigraph (source stage -> target stage), which König's theorem splits into R perfect matchings
    (found here by augmenting paths); each matching is one round, one collective-permute of one chunk
    per stage (ffn_model.pipeline.relay). Returns R rounds, each [(source s, its chunk j, target t, the
    target's slot r)] for s = 0..S−1; a round where every stage keeps its own chunk (t = s) moves
    nothing. Rounds that keep a chunk are tried first, so that at most one round is all local."""
    S, R = stages, repeats
    edges = {s: [(j, (s * R + j) % S, (s * R + j) // S) for j in range(R)] for s in range(S)}
    rounds = []
    for _ in range(R):
        match: dict[int, int] = {}  # target -> source

        def augment(s, seen, edges=edges, match=match):
            for j, t, _ in sorted(edges[s], key=lambda e: e[1] != s):  # a local edge first
                if t not in seen:
                    seen.add(t)
                    if t not in match or augment(match[t], seen):
                        match[t] = s
                        return True
            return False

        for s in range(S):
            augment(s, set())
        by_source = {s: t for t, s in match.items()}
        chosen = []
        for s in range(S):
            e = next(e for e in edges[s] if e[1] == by_source[s])
            edges[s].remove(e)
            chosen.append((s, e[0], e[1], e[2]))
        rounds.append(chosen)
    return sorted(rounds, key=lambda rd: sum(t != s for s, _, t, _ in rd))


@functools.cache
def relay_moves(stages: int, repeats: int) -> int:
    """Rounds of the circular re-lay that move anything (relay_rounds): each is one collective-permute
    over ``stage`` of one chunk of L/(S·R) blocks per device; R, less a round where every stage keeps
    its chunk."""
    return sum(any(t != s for s, _, t, _ in rd) for rd in relay_rounds(stages, repeats))


def microbatches_in_flight(schedule: Schedule, stages: int, remat: str = "none") -> int:
    """How many iterations' (or microbatches') residuals a device holds at the peak: all T = R·M + S − 1 of the
    scan (GPipe and circular: jax's reverse scan needs every forward iteration's residuals), 1 for gradient
    accumulation (each microbatch's backward runs before the next forward). 1F1B (ffn_model.pipeline.one_f_one_b):
    K = 2·R·S − 1, the ring of chunk residuals its forward slots keep (what the remat policy names, of every layer
    of the chunk; under remat full each layer's input, Megatron's full recomputation: the backward slot recomputes
    each layer's forward once), allocated whole on every stage.

    Against Megatron-LM's 1F1B (Narayanan et al. 2021, sec. 2.2; Korthikanti et al. 2022, sec. 4.2.3: stage 0
    holds S microbatches' activations at its peak, S·L/S = L layers' worth): here every iteration runs a forward
    and a backward slot in lock-step, one hop per iteration each way, so chunk r's backward runs on stage s
    2·(R − r)·S − 2 − 2s iterations after its forward: stage 0 holds up to 2·R·S − 1 chunks in flight (R = 1: 2S − 1
    microbatches, (2S − 1)·L/S layers' worth, about twice Megatron's S), and as one SPMD program every stage
    allocates the K slots stage 0 needs."""
    if stages > 1 and schedule.pipeline == Pipeline.ONE_F_ONE_B:
        return 2 * schedule.repeats * stages - 1
    return iterations(schedule, stages) if stages > 1 else 1

