"""PNG plots of sweep results (matplotlib, Agg backend), each written atomically.

Inputs are plain dicts built by engine.evaluation.sweep from the JSONL rows, so plots can be redrawn
from a results file alone.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

from engine.loading.files import atomic_path  # noqa: E402


def save(fig, path) -> Path:
    """Write the figure to a temporary sibling, then rename: never a half-written PNG."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
    finally:
        plt.close(fig)
    return Path(path)


def ppl_bars(ppl: dict, reference: dict, labels: list, sizes: list, corpora: list, path):
    """ppl[(label, size, corpus)] -> ppl; reference[corpus] -> full-cache ppl (dashed line)."""
    fig, axes = plt.subplots(1, len(corpora), figsize=((0.6 * len(labels) + 2) * len(corpora),
                                                      4.2), squeeze=False, layout="constrained")
    width = 0.8 / max(1, len(sizes))
    for ax, corpus in zip(axes[0], corpora):
        for j, size in enumerate(sizes):
            xs = [i + (j - (len(sizes) - 1) / 2) * width for i in range(len(labels))]
            ys = [ppl.get((label, size, corpus), float("nan")) for label in labels]
            ax.bar(xs, ys, width, label=f"cache {size}")
        if corpus in reference:
            ax.axhline(reference[corpus], color="k", ls="--", lw=1,
                       label=f"full {reference[corpus]:.2f}")
        finite = [v for (_, _, c), v in ppl.items() if c == corpus and v == v]
        finite += [reference[corpus]] if corpus in reference else []
        if finite:
            lo, hi = min(finite), max(finite)
            ax.set_ylim(lo - 0.15 * (hi - lo) - 0.01 * lo, hi + 0.1 * (hi - lo) + 0.01 * hi)
        ax.set_xticks(range(len(labels)), labels, rotation=40, ha="right")
        ax.set_title(f"streaming perplexity: {corpus}")
        ax.set_ylabel("ppl")
        ax.legend(fontsize=8)
    return save(fig, path)


def curves(curve: dict, labels: list, sizes: list, corpora: list, path):
    """curve[(label, size, corpus)] -> {"position": [...], "log_ppl": [...]}; size None = full,
    drawn in every panel as the reference (WeightedKV Fig. 4 style)."""
    fig, axes = plt.subplots(len(corpora), len(sizes), figsize=(5.2 * len(sizes),
                                                                3.6 * len(corpora)),
                             squeeze=False, layout="constrained")
    for r, corpus in enumerate(corpora):
        for c, size in enumerate(sizes):
            ax = axes[r][c]
            for label in labels:
                data = curve.get((label, None, corpus)) or curve.get((label, size, corpus))
                if data:
                    ax.plot(data["position"], data["log_ppl"], lw=1.2, label=label,
                            ls="--" if (label, None, corpus) in curve else "-")
            ax.set_title(f"{corpus}, cache {size}")
            ax.set_xlabel("position")
            ax.set_ylabel("running log ppl")
            ax.legend(fontsize=8)
    return save(fig, path)


def cache_bytes(nbytes: dict, labels: list, sizes: list, path):
    """nbytes[(label, size)] -> bytes of one stream's cache; size None = full (one bar)."""
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(labels)), 4), layout="constrained")
    width = 0.8 / max(1, len(sizes))
    for j, size in enumerate(sizes):
        xs = [i + (j - (len(sizes) - 1) / 2) * width for i in range(len(labels))]
        ys = [nbytes.get((label, size), nbytes.get((label, None), float("nan"))) / 2**20
              for label in labels]
        bars = ax.bar(xs, ys, width, label=f"cache {size}")
        ax.bar_label(bars, fmt="%.1f", fontsize=6)
    ax.set_xticks(range(len(labels)), labels, rotation=40, ha="right")
    ax.set_ylabel("cache MiB (one stream)")
    ax.set_title("KV cache bytes per policy")
    ax.legend(fontsize=8)
    return save(fig, path)


def _heatmap(ax, values: list, xticks: list, yticks: list):
    """values[row][column] in [0, 1] or None (blank), each cell labelled with its percent."""
    import numpy as np

    grid = np.full((len(values), len(xticks)), np.nan)
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            if v is not None:
                grid[i, j] = v
                ax.text(j, i, f"{v:.0%}", ha="center", va="center", fontsize=7)
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(xticks)), xticks, fontsize=7)
    ax.set_yticks(range(len(yticks)), yticks, fontsize=7)
    return image


def passkey_heatmaps(acc: dict, labels: list, sizes: list, lengths: list, depths: list, path):
    """acc[(label, size)][length][depth] -> accuracy in [0, 1]; one depth x length panel per
    policy (rows) and budget (columns); missing cells are blank."""
    fig, axes = plt.subplots(len(labels), len(sizes), figsize=(1.1 * len(lengths) * len(sizes)
                                                               + 1.5, 1.0 * len(depths)
                                                               * len(labels) + 0.8),
                             squeeze=False, layout="constrained")
    image = None
    for r, label in enumerate(labels):
        for c, size in enumerate(sizes):
            ax = axes[r][c]
            if label == "full" and c > 0:  # full ignores the budget: one panel is enough
                ax.axis("off")
                continue
            cell = acc.get((label, size), {})
            image = _heatmap(ax, [[cell.get(n, {}).get(d) for n in lengths] for d in depths],
                             [str(x) for x in lengths], [f"{d:g}" for d in depths])
            ax.set_title(label if label == "full" else f"{label} @ {size}", fontsize=8)
            if c == 0:
                ax.set_ylabel("depth", fontsize=7)
            if r == len(labels) - 1:
                ax.set_xlabel("length", fontsize=7)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="passkey accuracy")
    return save(fig, path)


def ruler_heatmaps(scores: dict, tasks: list, labels: list, sizes: list, lengths: list, path):
    """scores[task][(label, size)][length] -> mean score in [0, 1]; one (policy @ budget) x
    length panel per task, `full` in one row; missing cells are blank."""
    rows = [(label, size) for label in labels for size in (sizes[:1] if label == "full"
                                                            else sizes)]
    names = [label if label == "full" else f"{label} @ {size}" for label, size in rows]
    fig, axes = plt.subplots(1, len(tasks), figsize=(0.9 * len(lengths) * len(tasks) + 2.5
                                                     * len(tasks), 0.28 * len(rows) + 1.2),
                             squeeze=False, layout="constrained")
    image = None
    for ax, task in zip(axes[0], tasks):
        acc = scores.get(task, {})
        image = _heatmap(ax, [[acc.get(row, {}).get(n) for n in lengths] for row in rows],
                         [str(x) for x in lengths], names)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("length", fontsize=7)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="mean score")
    return save(fig, path)


def attention_loss(rows: list, ppl: dict, path):
    """rows: attention-loss rows (label, corpus, per_layer, loss); ppl[(label, corpus)] -> the
    policy's own perplexity and ppl[("full", corpus)] the reference. Left: loss per layer;
    right: mean loss against the perplexity increase over full."""
    corpora = sorted({r["corpus"] for r in rows})
    fig, axes = plt.subplots(len(corpora), 2, figsize=(11, 4 * len(corpora)), squeeze=False,
                             layout="constrained")
    for (left, right), corpus in zip(axes, corpora):
        mine = [r for r in rows if r["corpus"] == corpus]
        for r in mine:
            left.plot(range(len(r["per_layer"])), r["per_layer"], marker=".", label=r["label"])
        left.set(title=f"{corpus}: attention loss by layer", xlabel="layer",
                 ylabel="attention mass lost")
        left.legend(fontsize=7, ncol=2)
        ref = ppl.get(("full", corpus))
        for r in mine:
            got = ppl.get((r["label"], corpus))
            if got is None or ref is None:
                continue
            right.scatter(r["loss"], 100 * (got / ref - 1))
            right.annotate(r["label"], (r["loss"], 100 * (got / ref - 1)), fontsize=7)
        right.set(title=f"{corpus}: does the loss predict the damage?",
                  xlabel="attention loss (mean over layers and tokens)",
                  ylabel="ppl increase over full (%)")
    return save(fig, path)
