"""The lines a user reads of GLUE results (examples/glue): each dev subset's metrics and the
majority-class baseline, and the selected checkpoint. Formatting only: glue_tools.py's commands
print these lines."""

from typing import List


def summary_lines(results: dict) -> List[str]:
    out = []
    for entry in results["subsets"].values():
        shown = ", ".join(f"{k} {v:.2f}" for k, v in entry["metrics"].items())
        line = f"{results['task']} {entry['file']}: {shown} ({entry['examples']} examples)"
        if "majority_class" in entry:
            m = entry["majority_class"]
            line += f"; majority class '{m['label']}': accuracy {m['metrics']['accuracy']:.2f}"
        out.append(line)
    return out


def selection_line(results: dict) -> str:
    """The checkpoint select() chose, by which metric, of how many."""
    return (
        f"{results['task']}: selected {results['checkpoint']} by {results['primary_metric']} "
        f"{results['score']:.2f} (of {len(results['candidates'])} checkpoints)"
    )


def split_lines(
    task_name: str, split_file: str, subset: str, columns: int, info: dict
) -> List[str]:
    """What split_task found in one GLUE file: its examples, and the malformed rows dropped."""
    out = []
    dropped = info.get("dropped_lines", [])
    if dropped:
        out.append(
            f"{task_name} {split_file}: dropped {len(dropped)} malformed rows (not {columns} "
            "columns, as fairseq's preprocess_GLUE_tasks.sh drops them): lines "
            f"{', '.join(map(str, dropped[:10]))}{' ...' if len(dropped) > 10 else ''}"
        )
    empty = info["empty_inputs"]
    out.append(f"{task_name} {split_file} -> {subset}: {info['rows']} examples"
               + (f", {empty} empty inputs" if empty else ""))  # fmt: skip
    return out
