"""Below the all-reduce floor, which node is slow? Nodes are paired in rounds (the circle method: every round pairs
each node with a new partner), each pair times an all-reduce of its own, and a node is slow when every pair it was
in fell below the floor while its partners reached it elsewhere. Two nodes alone cannot be told apart."""

from __future__ import annotations

from collections.abc import Callable


def pair_rounds(nodes: int, rounds: int) -> list[list[tuple[int, int]]]:
    """Up to `rounds` rounds of disjoint node pairs, each node paired with a different partner every round."""
    ring: list[int | None] = [*range(nodes), *([None] if nodes % 2 else [])]
    schedule: list[list[tuple[int, int]]] = []
    for _ in range(min(rounds, len(ring) - 1)):
        half = len(ring) // 2
        pairs = [(a, b) for a, b in zip(ring[:half], reversed(ring[half:]), strict=True)]
        schedule.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return schedule


def judge(measured: dict[tuple[int, int], float], floor: float) -> tuple[list[int], list[tuple[int, int]]]:
    """(slow nodes, slow pairs it does not explain) from each pair's bus bandwidth. A node is slow when all its
    pairs fell below the floor and one of its partners reached the floor in another pair."""
    healthy = {n for pair, bandwidth in measured.items() if bandwidth >= floor for n in pair}
    slow = sorted(
        {
            n
            for pair in measured
            for n in pair
            if n not in healthy and any(n in p and set(p) & healthy for p in measured)
        }
    )
    unexplained = [
        p for p, bandwidth in sorted(measured.items()) if bandwidth < floor and not set(p) & set(slow)
    ]
    return slow, unexplained


def measure_pairs(
    rounds: list[list[tuple[int, int]]],
    ranks_of_node: dict[int, list[int]],
    new_group: Callable[[list[int]], object],
    my_node: int,
    time_all_reduce: Callable[[object, int], float],
) -> dict[tuple[int, int], float]:
    """Bus bandwidth of each pair this rank takes part in. Every rank creates every group in the same order (as
    torch.distributed.new_group requires); the pairs of a round run at the same time."""
    measured = {}
    for round_pairs in rounds:
        groups = {pair: new_group(ranks_of_node[pair[0]] + ranks_of_node[pair[1]]) for pair in round_pairs}
        for pair, group in groups.items():
            if my_node in pair:
                size = len(ranks_of_node[pair[0]]) + len(ranks_of_node[pair[1]])
                measured[pair] = time_all_reduce(group, size)
    return measured
