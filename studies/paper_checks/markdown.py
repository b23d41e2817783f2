"""The generated tables of docs/paper_checks_results.md (RealFormer paper checks, He et al.,
arXiv 2012.11747): numbers only; the verdicts in docs/paper_checks.md are prose."""

from .config import SIZES


def fmt(ms, digits=3):
    if not ms or ms["mean"] is None:
        return "not run"
    return f"{ms['mean']:.{digits}f} ± {ms['std']:.{digits}f} (n={ms['n']})"


def markdown(summary, cfg) -> str:
    """The generated tables of docs/paper_checks.md (numbers only; the verdicts are prose)."""
    layers, width, heads, ffn, batch = SIZES[cfg.size]
    rows = [
        f"MLM, {layers}L d={width} {heads} heads ffn {ffn}, 128 tokens x {batch} per update, "
        f"{cfg.max_update} updates, peak LR {cfg.lr:g}; held-out valid split",
        "",
        "| variant | held-out MLM loss (base 2) | held-out MLM accuracy (%) | updates to reach "
        "Post-LN's final loss (per seed; seed-mean curve) |",
        "|---|---|---|---|",
    ]
    for label, t in summary["mlm_table"].items():
        sp = summary["updates_to_postln_final_loss"].get(label, {})
        per = (
            ", ".join(
                f"s{k}: {v if v is not None else 'never'}"
                for k, v in sp.get("per_seed", {}).items()
            )
            or "not run"
        )
        mean_c = sp.get("seed_mean_curve")
        rows.append(
            f"| {label} | {fmt(t['final_valid_loss'])} | {fmt(t['final_valid_accuracy'], 2)} | "
            f"{per}; {mean_c if mean_c is not None else 'never'} |"
        )
    rows += [
        "",
        "Paired by seed (same initial RNG and batch order as that seed's Post-LN run):",
        "",
        "| variant | final loss − Post-LN's (bits, per seed) | updates to reach that seed's "
        "Post-LN final loss |",
        "|---|---|---|",
    ]
    for label, sp in summary["updates_to_postln_final_loss"].items():
        paired = sp.get("paired", {})
        rows.append(
            f"| {label} | "
            + ", ".join(f"s{k}: {v['loss_minus_postln']:+.3f}" for k, v in paired.items())
            + " | "
            + ", ".join(f"s{k}: {v['updates_to_reach'] or 'never'}" for k, v in paired.items())
            + " |"
        )
    rows += ["", "Attention (MLM encoder, seed mean), per layer 0..L-1:", ""]
    rows += ["| variant | mean entropy (nats) | mean JS to layer below (nats) |", "|---|---|---|"]
    for label, a in summary["mlm_attention"].items():
        ent = " ".join(f"{x:.3f}" for x in a["entropy"])
        js = " ".join("-" if x is None else f"{x:.4f}" for x in a["js"])
        rows.append(f"| {label} | {ent} | {js} |")
    rows += [
        "",
        "LR sweep (seed 1):",
        "",
        "| variant | peak LR | held-out loss | accuracy | diverged |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(summary["lr_sweep"], key=lambda r: (r["variant"], r["lr"])):
        rows.append(
            f"| {r['variant']} | {r['lr']:g} | {r['final_valid_loss']:.3f} | "
            f"{r['final_valid_accuracy']:.2f} | {r['diverged']} |"
        )
    nmt = summary.get("nmt_attention")
    rows += ["", "NMT attention (ADMIN vs RealFormer+ADMIN, seed 1), per layer 0..L-1:", ""]
    if not nmt:
        rows.append("not run")
    else:
        rows += ["| chain | variant | mean entropy (nats) | mean JS to layer below (nats) |"]
        rows += ["|---|---|---|---|"]
        for chain in ("encoder", "decoder", "cross"):
            for label, chains in nmt.items():
                if chain in chains:
                    ent = " ".join(f"{x:.3f}" for x in chains[chain]["entropy_per_layer"]["mean"])
                    js = " ".join(
                        "-" if x is None else f"{x:.4f}"
                        for x in chains[chain]["js_per_layer"]["mean"]
                    )
                    rows.append(f"| {chain} | {label} | {ent} | {js} |")
    return "\n".join(rows) + "\n"
