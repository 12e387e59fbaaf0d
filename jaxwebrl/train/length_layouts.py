"""A minibatch's rows in length groups, each padded to its own width, with a bounded number of compiled layouts.

    layouts = LengthLayouts(n_groups=8, max_layouts=4)
    order, groups = layouts(lengths, width)   # lengths [R] real tokens a row; width: the minibatch's T
    # order [R]: the rows longest first; groups ((rows, width), ...): a static key of the jitted update

The rows, longest first, split into `n_groups` chunks of near-equal row count (`np.array_split`: the sizes depend on
R alone), each padded to the length bucket of its longest row (`assembly.length_bucket`). The chunks' widths are a
static key, so every new combination compiles the train step and the log-prob pass again; over a run's varied rows
that is dozens of combinations, and the padding bought back costs a compile each, minutes at 8B. Simulated with the
planner's three row lengths (about 1,299, 2,342 and 3,385 tokens, T 3,584), 8 rows a minibatch in 8 groups, 5 draws
of 200 minibatches: in the planner's shares (10/10/80%), 23-28 own layouts at 6.0-6.1% padding of tokens; kept to 8,
8 layouts at 8.2-9.0%; kept to 4, 4-5 at 8.6-10.7%. In equal shares (a harder mix): 60-71 own at 7.6-7.7%; kept to
8, 9 at 13.0-19.1%; kept to 4, 5 at 15.9-21.0%. `LengthLayouts` keeps at most `max_layouts` of them per minibatch
shape (R, T): a minibatch whose own widths are not kept takes the narrowest kept layout at least as wide in every
chunk when that costs at most `COVER_SLACK` more padded tokens, else its own while fewer than `max_layouts` are
kept, else the narrowest kept one that covers it, else every row at T. So each shape compiles at most `max_layouts`
+ 1 layouts.
"""

from __future__ import annotations

import numpy as np

from jaxwebrl.train.assembly import length_bucket

COVER_SLACK = 0.10   # a kept layout serves a minibatch when it pads at most 10% more tokens than the minibatch's own


def length_groups(lengths: np.ndarray, n_groups: int, width: int) -> tuple[np.ndarray, tuple]:
    """(order [R], groups) of one minibatch with its own widths: the rows longest first in `n_groups` chunks, each
    at the bucket of its longest row, neighbours of one width merged (see the module docstring)."""
    order, widths = _chunk_widths(lengths, n_groups, width)
    return order, _merged(order, widths)


def _chunk_sizes(rows: int, chunks: int, multiple: int = 1) -> list[int]:
    """Rows in each of `chunks` chunks of near-equal row count, each a multiple of `multiple` (`np.array_split`'s
    sizes over rows / multiple units: fixed by the counts)."""
    return [len(chunk) * multiple for chunk in np.array_split(np.arange(rows // multiple), chunks)]


def _row_unit(rows: int, multiple: int) -> int:
    """The chunks' row multiple: `multiple` (a trainer mesh's data × fsdp) when it divides `rows`, else 1 (rows
    that do not split over the batch axes run whole on every chip, however they are grouped)."""
    return multiple if multiple > 1 and rows % multiple == 0 else 1


def _chunk_widths(lengths: np.ndarray, n_groups: int, width: int,
                  multiple: int = 1) -> tuple[np.ndarray, tuple[int, ...]]:
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    sizes = _chunk_sizes(len(order), min(max(n_groups, 1), len(order) // multiple), multiple)
    ends = np.cumsum(sizes)
    return order, tuple(length_bucket(int(lengths[order[end - size:end]].max()), width)
                        for size, end in zip(sizes, ends))


def _merged(order: np.ndarray, widths: tuple[int, ...], multiple: int = 1) -> tuple:
    """((rows, width), ...) of the chunks of `order` at `widths`, neighbours of one width merged."""
    groups: list[list[int]] = []
    for rows, chunk_width in zip(_chunk_sizes(len(order), len(widths), multiple), widths):
        if groups and groups[-1][1] == chunk_width:
            groups[-1][0] += rows
        else:
            groups.append([rows, chunk_width])
    return tuple((rows, w) for rows, w in groups)


class LengthLayouts:
    """`length_groups` with at most `max_layouts` kept chunk widths per minibatch shape (the module docstring)."""

    def __init__(self, n_groups: int, max_layouts: int):
        if max_layouts < 1:
            raise ValueError(f"max_layouts={max_layouts}: keep at least one layout (train.length_layouts >= 1)")
        self.n_groups, self.max_layouts = int(n_groups), int(max_layouts)
        self.kept: dict[tuple[int, int], list[tuple[int, ...]]] = {}

    def __call__(self, lengths: np.ndarray, width: int, row_multiple: int = 1) -> tuple[np.ndarray, tuple]:
        """row_multiple: each group's rows a multiple of it when it divides the minibatch's (a trainer mesh's
        data × fsdp: a group's rows then split over the batch axes, `parallel.mesh.constrain_batch`)."""
        multiple = _row_unit(len(lengths), row_multiple)
        order, own = _chunk_widths(lengths, self.n_groups, width, multiple)
        return order, _merged(order, self.widths(own, len(order), width, multiple), multiple)

    def widths(self, own: tuple[int, ...], rows: int, width: int, multiple: int = 1) -> tuple[int, ...]:
        """The chunk widths a minibatch of `rows` rows at T = `width` whose own chunk widths are `own` (chunks of
        `multiple`-row units) runs at."""
        kept = self.kept.setdefault((rows, width, multiple), [])
        if own in kept:
            return own
        sizes = _chunk_sizes(rows, len(own), multiple)

        def tokens(widths):
            return sum(n * w for n, w in zip(sizes, widths))

        covering = sorted((w for w in kept if all(a >= b for a, b in zip(w, own))), key=tokens)
        if covering and tokens(covering[0]) <= (1 + COVER_SLACK) * tokens(own):
            return covering[0]
        if len(kept) < self.max_layouts:
            kept.append(own)
            return own
        return covering[0] if covering else (width,) * len(own)
