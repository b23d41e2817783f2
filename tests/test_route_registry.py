"""The routes of residual attention (RealFormer, arXiv 2012.11747) are one registry,
``realformer_fairseq.modules.routes.ROUTES``: a class added to it is a value of
``--residual-attention-impl`` and is built for every residual attention layer, with no other
change (docs/reference.md, "Adding a route")."""

import pytest
import torch
from harness import USER_DIR, random_batch, toy_dictionary

from realformer_fairseq.modules.routes import ROUTES, RealformerMultiheadAttention

LAYERS = ["--encoder-layers", "2", "--decoder-layers", "3", "--init-type", "default"]
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]


class ProbeRoute(RealformerMultiheadAttention):
    """The eager route under its own name and class: nothing else."""


@pytest.fixture(scope="module")
def dict_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("route-registry-dicts")
    for name in ("dict.en.txt", "dict.fr.txt"):
        toy_dictionary().save(str(root / name))
    return root


def parse(dict_dir, *flags):
    from fairseq import options

    argv = [str(dict_dir), "--user-dir", USER_DIR, "--task", "translation", "-s", "en"]
    argv += ["-t", "fr", "--cpu", "--arch", "realformer_tiny", *LAYERS, *NO_DROPOUT, *flags]
    return options.parse_args_and_arch(options.get_training_parser(), argv)


def build(dict_dir, *flags):
    """A fairseq-train command line's model, parsed and built as fairseq-train does."""
    from fairseq import tasks

    args = parse(dict_dir, *flags)
    return tasks.setup_task(args).build_model(args)


def impl_flag_declaration() -> dict:
    """What the models' ``add_args`` declare for ``--residual-attention-impl``, read now."""
    from realformer_fairseq.settings import add_realformer_args

    recorded = {}

    class Recorder:
        def add_argument(self, option, **kwargs):
            recorded[option] = kwargs

    add_realformer_args(Recorder())
    return recorded["--residual-attention-impl"]


def residual_modules(model):
    """Every residual attention module: 2 encoder self-attention, 3 decoder self- and 3
    cross-attention."""
    encoder = [layer.self_attn for layer in model.encoder.layers]
    decoder = [m for layer in model.decoder.layers for m in (layer.self_attn, layer.encoder_attn)]
    return encoder + decoder


def test_a_route_added_to_the_registry_is_a_flag_value_built_for_every_residual_layer(
    dict_dir, monkeypatch, capsys
):
    with pytest.raises(SystemExit):  # not a route yet: argparse refuses the value
        parse(dict_dir, "--residual-attention-impl", "probe")
    assert "invalid choice: 'probe'" in capsys.readouterr().err

    monkeypatch.setitem(ROUTES, "probe", ProbeRoute)
    model = build(dict_dir, "--residual-attention-impl", "probe")
    modules = residual_modules(model)
    assert len(modules) == 8
    assert [type(m) for m in modules] == [ProbeRoute] * 8
    assert [m.residual_attention_impl for m in modules] == ["probe"] * 8
    assert sum(isinstance(m, RealformerMultiheadAttention) for m in model.modules()) == 8
    declared = impl_flag_declaration()
    assert declared["choices"] == ("eager", "concat", "triton", "auto", "probe")
    assert declared["help"].endswith("; probe: materialises the float32 running sum of scores")

    # it computes what the eager route computes with the same weights
    eager = build(dict_dir, "--residual-attention-impl", "eager")
    assert [type(m) for m in residual_modules(eager)] == [RealformerMultiheadAttention] * 8
    eager.load_state_dict(model.state_dict())
    src_tokens, src_lengths, prev_output_tokens = random_batch(toy_dictionary(), seed=5)
    model.eval(), eager.eval()
    with torch.no_grad():
        got = model(src_tokens, src_lengths, prev_output_tokens)[0]
        want = eager(src_tokens, src_lengths, prev_output_tokens)[0]
    assert torch.equal(got, want)
    assert [m.calls for m in modules] == [1] * 8


def test_every_route_name_is_a_flag_value_and_nothing_else_is():
    assert list(ROUTES) == ["eager", "concat", "triton", "auto"]
    declared = impl_flag_declaration()
    assert declared["choices"] == ("eager", "concat", "triton", "auto")
    assert declared["help"].startswith(
        "how the residual score chains are computed (the same values): eager: materialises"
    )


def test_one_name_for_one_stream_per_chain_and_for_what_a_call_ran():
    eager = RealformerMultiheadAttention(16, 2, "sum", self_attention=True)
    assert eager.one_stream_per_chain is False  # off on the eager route
    eager.kept_stream = True  # the eager route's former name still switches it
    assert eager.one_stream_per_chain is True and eager.kept_stream is True
    concat = ROUTES["concat"](16, 2, "sum", self_attention=True)
    x = torch.randn(5, 2, 16)
    with torch.no_grad():
        concat(x, x, x, need_weights=True)
    assert (
        concat.last_route == "eager, because the attention probabilities are asked for "
        "(need_weights)"
    )
    assert concat.last_kernel == concat.last_route  # the former name


def test_the_routes_code_holds_no_issue_number_date_or_timing():
    import re
    from pathlib import Path

    import realformer_fairseq.modules.routes as routes

    files = sorted(Path(routes.__file__).parent.glob("*.py"))
    assert len(files) == 13  # the ten route modules and the triton concat phase's three
    history = re.compile(r"[Ii]ssue \d+|\b20\d\d-\d\d-\d\d\b|\d+(\.\d+)? ?(s|ms|seconds)\b")
    found = [(p.name, m.group(0)) for p in files for m in history.finditer(p.read_text())]
    assert found == []
