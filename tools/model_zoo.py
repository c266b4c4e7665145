"""Architectures from ``transformers`` on the xla device against CPU torch (issue 58).

Each entry of ``ZOO`` builds a tiny model of one architecture from its config class
(random weights, seeded, no downloads; every dropout, layerdrop, drop-path and
SpecAugment probability at 0, so a training step is deterministic) and a batch for it.
``tests/test_model_zoo.py`` checks a training step (loss, every gradient) in each mode
against CPU torch, ``generate`` and ``torch.compile``.

    python -m tools.model_zoo [--only llama,bert] [--no-write]

measures, per architecture, what a warm (second) training step costs: in lazy mode the
graphs compiled or found cached and the syncs (graph runs) inside the step, in eager mode
the compiles, and rewrites the "Architectures from transformers" section of
docs/op-coverage.md.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
import time
import warnings
from typing import Callable

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "op-coverage.md")
BEGIN, END = "<!-- model-zoo: begin -->", "<!-- model-zoo: end -->"

VOCAB = 128
#: float32 on two backends: sums in another order. (atol, rtol) of the loss, of gradients.
LOSS_TOL = (1e-5, 1e-5)
GRAD_TOL = (1e-5, 1e-3)
BATCH, SEQ = 2, 12


@dataclasses.dataclass(frozen=True)
class Arch:
    name: str
    family: str
    model: Callable[[], torch.nn.Module]   # seeded; on CPU, in training mode
    batch: Callable[[], dict]              # CPU tensors, keyword arguments of forward
    note: str = ""
    #: ops it runs on CPU torch (``aten::<op>`` counters), none by default: each has its
    #: reason in ``CPU_OPS``
    cpu_ops: frozenset = frozenset()


#: Why an op of a model runs on CPU torch (the values stay CPU torch's: its inputs come
#: to the host and its result goes back, a sync each time).
CPU_OPS = {
    "aten::masked_select": "its result's shape depends on the mask's values (by design: "
                           "XLA compiles static shapes); transformers' CTC loss drops the "
                           "labels' padding with it",
    "aten::_ctc_loss": "no lowering: the CTC loss's alpha recursion, with lengths given as "
                       "tensors (docs/op-coverage.md, expected failures)",
    "aten::_ctc_loss_backward": "no lowering (as _ctc_loss)",
}
_CTC = frozenset({"aten::masked_select", "aten::_ctc_loss", "aten::_ctc_loss_backward"})


def _quiet(cfg):
    """No randomness in a training step: every dropout-like probability at 0."""
    for k, v in cfg.to_dict().items():
        if isinstance(v, float) and ("drop" in k or k in ("mask_time_prob", "mask_feature_prob")):
            setattr(cfg, k, 0.0)
    return cfg


def _build(cls_name, cfg_name, experts=None, **fields):
    """A seeded model of transformers' ``cls_name`` from ``cfg_name(**fields)``, quiet
    (``_quiet``), in training mode. transformers is imported at the first build."""
    def model():
        import transformers
        cfg = _quiet(getattr(transformers, cfg_name)(**fields))
        if experts:
            cfg._experts_implementation = experts  # transformers' default: grouped_mm
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return getattr(transformers, cls_name)(cfg).train()
    return model


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def causal_batch(pad=True):
    """Token ids, the second row right-padded (masked, no loss there)."""
    def batch():
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=_gen(1))
        out = dict(input_ids=ids, labels=ids.clone())
        if pad:
            mask = torch.ones(BATCH, SEQ, dtype=torch.long)
            mask[1, 9:] = 0
            out["labels"][1, 9:] = -100
            out["attention_mask"] = mask
        return out
    return batch


def mlm_batch(token_types=False):
    def batch():
        ids = torch.randint(5, VOCAB, (BATCH, SEQ), generator=_gen(1))
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[1, 9:] = 0
        labels = torch.full((BATCH, SEQ), -100)
        labels[0, 3], labels[1, 5], labels[1, 7], labels[0, 10] = 11, 42, 7, 99
        out = dict(input_ids=ids, attention_mask=mask, labels=labels)
        if token_types:
            out["token_type_ids"] = (torch.arange(SEQ) >= 6).long().expand(BATCH, SEQ)
        return out
    return batch


def seq2seq_batch():
    g = _gen(1)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, 8:] = 0
    labels = torch.randint(3, VOCAB, (BATCH, 7), generator=g)
    labels[1, 5:] = -100
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def image_batch(size=32, classes=5):
    def batch():
        g = _gen(2)
        return dict(pixel_values=torch.randn(BATCH, 3, size, size, generator=g),
                    labels=torch.randint(0, classes, (BATCH,), generator=g))
    return batch


def audio_batch():
    g = _gen(3)
    values = torch.randn(BATCH, 400, generator=g)
    labels = torch.randint(1, 20, (BATCH, 6), generator=g)
    labels[1, 4:] = -100  # a shorter transcript
    return dict(input_values=values, labels=labels)


def whisper_batch():
    g = _gen(3)
    labels = torch.randint(3, VOCAB, (BATCH, 6), generator=g)
    labels[1, 4:] = -100
    return dict(input_features=torch.randn(BATCH, 16, 32, generator=g), labels=labels)


_DEC = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
_ENC = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
_MOE = dict(num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.02)
_S2S = dict(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)


def _zoo() -> list[Arch]:
    dense, moe = "decoder LM", "decoder LM, MoE"
    cb = causal_batch()
    return [
        # decoder LMs
        Arch("llama", dense, _build("LlamaForCausalLM", "LlamaConfig", **_DEC), cb),
        Arch("mistral", dense, _build("MistralForCausalLM", "MistralConfig", **_DEC,
                                      sliding_window=8), cb, "sliding window 8 < sequence"),
        Arch("qwen2", dense, _build("Qwen2ForCausalLM", "Qwen2Config", **_DEC), cb),
        Arch("qwen3", dense, _build("Qwen3ForCausalLM", "Qwen3Config", **_DEC, head_dim=8), cb),
        Arch("gemma", dense, _build("GemmaForCausalLM", "GemmaConfig", **_DEC, head_dim=8), cb),
        Arch("gemma2", dense, _build("Gemma2ForCausalLM", "Gemma2Config", **_DEC, head_dim=8,
                                     sliding_window=8), cb, "logit soft-capping, sliding window"),
        Arch("gpt2", dense, _build("GPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_embd=32,
                                   n_layer=2, n_head=4, n_positions=64, bos_token_id=1,
                                   eos_token_id=2, pad_token_id=0), cb),
        Arch("gpt_neox", dense, _build("GPTNeoXForCausalLM", "GPTNeoXConfig", vocab_size=VOCAB,
                                       hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, max_position_embeddings=64,
                                       rotary_pct=0.5, pad_token_id=0), cb),
        Arch("phi", dense, _build("PhiForCausalLM", "PhiConfig", vocab_size=VOCAB, hidden_size=32,
                                  intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  max_position_embeddings=64, partial_rotary_factor=0.5,
                                  pad_token_id=0), cb),
        Arch("opt", dense, _build("OPTForCausalLM", "OPTConfig", vocab_size=VOCAB, hidden_size=32,
                                  num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                                  word_embed_proj_dim=32, max_position_embeddings=64,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2), cb),
        Arch("falcon", dense, _build("FalconForCausalLM", "FalconConfig", vocab_size=VOCAB,
                                     hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2), cb,
             "multi-query, parallel attention"),
        # mixtures of experts (tokens per expert by histc, the load-balancing loss too)
        Arch("mixtral", moe, _build("MixtralForCausalLM", "MixtralConfig", **_DEC, **_MOE,
                                    num_local_experts=4), cb),
        Arch("mixtral_eager_experts", moe, _build("MixtralForCausalLM", "MixtralConfig", **_DEC,
                                                  **_MOE, num_local_experts=4, experts="eager"),
             cb, "`_experts_implementation=\"eager\"`"),
        Arch("mixtral_batched_mm", moe, _build("MixtralForCausalLM", "MixtralConfig", **_DEC,
                                               **_MOE, num_local_experts=4, experts="batched_mm"),
             cb, "`_experts_implementation=\"batched_mm\"`"),
        Arch("qwen2_moe", moe, _build("Qwen2MoeForCausalLM", "Qwen2MoeConfig", **_DEC, **_MOE,
                                      num_experts=4, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=32), cb,
             "shared expert"),
        Arch("olmoe", moe, _build("OlmoeForCausalLM", "OlmoeConfig", **_DEC, **_MOE,
                                  num_experts=4), cb),
        # state space (the slow path: no CUDA kernels)
        Arch("mamba", "state space", _build("MambaForCausalLM", "MambaConfig", vocab_size=VOCAB,
                                            hidden_size=32, state_size=8, num_hidden_layers=2,
                                            expand=2, conv_kernel=4, pad_token_id=0),
             causal_batch(pad=False)),
        # encoders (masked LM)
        Arch("bert", "encoder", _build("BertForMaskedLM", "BertConfig", **_ENC, type_vocab_size=2),
             mlm_batch(token_types=True)),
        Arch("roberta", "encoder", _build("RobertaForMaskedLM", "RobertaConfig", **_ENC,
                                          type_vocab_size=1), mlm_batch(),
             "position ids from the padding"),
        Arch("distilbert", "encoder", _build("DistilBertForMaskedLM", "DistilBertConfig",
                                             vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4,
                                             hidden_dim=64, max_position_embeddings=64,
                                             pad_token_id=0), mlm_batch()),
        Arch("albert", "encoder", _build("AlbertForMaskedLM", "AlbertConfig", **_ENC,
                                         embedding_size=16), mlm_batch(token_types=True),
             "shared layers"),
        Arch("electra", "encoder", _build("ElectraForMaskedLM", "ElectraConfig", **_ENC,
                                          embedding_size=16), mlm_batch(token_types=True)),
        Arch("deberta_v2", "encoder", _build("DebertaV2ForMaskedLM", "DebertaV2Config", **_ENC,
                                             relative_attention=True, position_buckets=8,
                                             pos_att_type=["p2c", "c2p"]), mlm_batch(),
             "disentangled relative attention"),
        # encoder-decoders
        Arch("t5", "encoder-decoder", _build("T5ForConditionalGeneration", "T5Config",
                                             vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
                                             num_layers=1, num_decoder_layers=1, num_heads=4,
                                             relative_attention_num_buckets=8,
                                             decoder_start_token_id=0, pad_token_id=0),
             seq2seq_batch, "relative position buckets"),
        Arch("bart", "encoder-decoder", _build("BartForConditionalGeneration", "BartConfig",
                                               **_S2S), seq2seq_batch),
        Arch("marian", "encoder-decoder", _build("MarianMTModel", "MarianConfig", **_S2S),
             seq2seq_batch, "sinusoidal positions"),
        # vision (classification)
        Arch("vit", "vision", _build("ViTForImageClassification", "ViTConfig", image_size=32,
                                     patch_size=8, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     num_labels=5), image_batch()),
        Arch("resnet", "vision", _build("ResNetForImageClassification", "ResNetConfig",
                                        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                        layer_type="basic", num_labels=5), image_batch(),
             "BatchNorm in training mode"),
        Arch("convnext", "vision", _build("ConvNextForImageClassification", "ConvNextConfig",
                                          hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                                          patch_size=2, num_labels=5), image_batch()),
        Arch("swin", "vision", _build("SwinForImageClassification", "SwinConfig", image_size=32,
                                      patch_size=2, embed_dim=16, depths=[1, 1],
                                      num_heads=[2, 2], window_size=4, num_labels=5),
             image_batch(), "shifted windows"),
        # speech
        Arch("wav2vec2", "speech", _build("Wav2Vec2ForCTC", "Wav2Vec2Config", vocab_size=20,
                                          hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=64,
                                          conv_dim=(16, 16), conv_stride=(5, 4),
                                          conv_kernel=(10, 8), num_conv_pos_embeddings=8,
                                          num_conv_pos_embedding_groups=4, pad_token_id=0),
             audio_batch, "CTC loss; weight-normed positional conv", cpu_ops=_CTC),
        Arch("whisper", "speech", _build("WhisperForConditionalGeneration", "WhisperConfig",
                                         vocab_size=VOCAB, num_mel_bins=16, d_model=32,
                                         encoder_layers=1, decoder_layers=1,
                                         encoder_attention_heads=4, decoder_attention_heads=4,
                                         encoder_ffn_dim=64, decoder_ffn_dim=64,
                                         max_source_positions=16, max_target_positions=32,
                                         pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                         decoder_start_token_id=1), whisper_batch),
    ]


ZOO: list[Arch] = _zoo()
BY_NAME = {a.name: a for a in ZOO}


def to(batch: dict, device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def train_step(model, batch):
    """Forward with labels, backward; the loss."""
    loss = model(**batch).loss
    loss.backward()
    return loss


def pair(arch: Arch):
    """(CPU model, the same weights on xla)."""
    cpu = arch.model()
    return cpu, copy.deepcopy(cpu).to("xla")


def grads(model) -> dict:
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def worst_error(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> float:
    """The largest |got - want| / (atol + rtol * |want|): <= 1 is allclose."""
    got = got.detach().cpu().double()
    want = want.detach().double()
    return ((got - want).abs() / (atol + rtol * want.abs())).max().item() if want.numel() else 0.0


# ---------------------------------------------------------------------------------------
# Measuring a warm step

def _counters():
    import xlanb
    return {n: xlanb.metrics.counter_value(n) or 0 for n in xlanb.metrics.counter_names()}


def _runs():
    import xlanb
    data = xlanb.metrics.metric_data("ExecuteTime")
    return data[0] if data else 0


def _syncs() -> int:
    """Lazy syncs so far (each runs a graph, or its segments; a tool may look inside)."""
    from xlanb.execute.graphs import _syncs_at
    return sum(_syncs_at.values())


def check(arch: Arch) -> float:
    """One training step on xla against CPU torch: the worst of the loss and every
    gradient as ``worst_error`` measures it (<= 1: allclose at ``GRAD_TOL``)."""
    cpu, model = pair(arch)
    batch = arch.batch()
    want = train_step(cpu, batch)
    got = train_step(model, to(batch, "xla"))
    import xlanb
    xlanb.sync()
    gx = grads(model)
    errs = [worst_error(got, want, *LOSS_TOL)]
    for name, g in grads(cpu).items():
        if (g is None) != (gx[name] is None):
            return float("inf")
        if g is not None:
            errs.append(worst_error(gx[name], g, *GRAD_TOL))
    return max(errs)


STEPS = 3  # measured steps per mode (lazy, eager); the table shows the second's counts


def measure(arch: Arch, mode: str, steps: int = STEPS) -> dict:
    """Counters of each training step (zero_grad, forward, backward, SGD step, sync, with
    nothing read on the way) in ``mode``; ``check``'s worst error; the ops that ran on
    CPU torch."""
    import xlanb
    xlanb.set_mode(mode)
    xlanb.metrics.clear()
    out = {"worst": check(arch), "steps": []}
    fallbacks = {n for n in xlanb.metrics.counter_names() if n.startswith("aten::")}
    _, model = pair(arch)
    xb = to(arch.batch(), "xla")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        xlanb.sync()
        xlanb.metrics.clear()
        syncs = _syncs()
        opt.zero_grad(set_to_none=True)
        train_step(model, xb)
        opt.step()
        xlanb.sync()
        c = _counters()
        fallbacks |= {n for n in c if n.startswith("aten::")}
        out["steps"].append(dict(c, runs=_runs(), syncs=_syncs() - syncs))
    out["fallbacks"] = sorted(fallbacks)
    return out


def _worker(name: str) -> int:
    import json
    import xlanb  # noqa: F401
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    res = {m: measure(BY_NAME[name], m) for m in ("lazy", "eager")}
    res["opbyop"] = measure(BY_NAME[name], "opbyop", steps=0)  # the values alone
    res["seconds"] = time.perf_counter() - t0
    print(json.dumps(res))
    return 0


_COMPILES = {"lazy": ("UncachedCompile",), "eager": ("EagerRunCompile", "OpCompile"),
             "opbyop": ("OpCompile",)}


def _steady(steps: list, mode: str) -> str:
    """The first step from which nothing compiles (of those measured)."""
    for i in range(len(steps)):
        if not any(s.get(k, 0) for s in steps[i:] for k in _COMPILES[mode]):
            return str(i + 1)
    return f"> {len(steps)}"


def _sync_cell(step: dict) -> str:
    """Syncs; with the graphs run where a sync ran its graph as segments."""
    if step["runs"] == step["syncs"]:
        return str(step["syncs"])
    return f"{step['syncs']} ({step['runs']} runs)"


def _row(arch: Arch, res: dict) -> str:
    lazy, eager = res["lazy"]["steps"][1], res["eager"]["steps"][1]
    worst = max(res[m]["worst"] for m in ("lazy", "eager", "opbyop"))
    fb = sorted(set().union(*(res[m]["fallbacks"] for m in ("lazy", "eager", "opbyop"))))
    status = "pass" if worst <= 1 else "**values differ**"
    if fb:
        status += " (CPU: " + ", ".join(f"`{f[6:]}`" for f in fb) + ")"
    return (f"| {arch.name} | {arch.family} | {status} | {worst:.2f} | "
            f"{lazy.get('UncachedCompile', 0)} / {lazy.get('CachedCompile', 0)} | "
            f"{_sync_cell(lazy)} | {_steady(res['lazy']['steps'], 'lazy')} | "
            f"{eager.get('EagerRunCompile', 0)} / {eager.get('OpCompile', 0)} | "
            f"{_steady(res['eager']['steps'], 'eager')} | {arch.note} |")


def section(rows: list[str], seconds: float) -> str:
    import transformers
    return "\n".join([
        BEGIN,
        "## Architectures from transformers (issue 58)", "",
        f"Measured by `python -m tools.model_zoo` (torch {torch.__version__}, transformers "
        f"{transformers.__version__}; {seconds / 60:.0f} min; each architecture in a fresh "
        "process); `tests/test_model_zoo.py` checks the same models. Each is a "
        "tiny model of its config class (hidden size 32, one or two layers, a vocabulary "
        "of 128, random weights, every dropout at 0) in training mode, with transformers' "
        "default attention (SDPA) and a padded batch. A step is "
        "`zero_grad(set_to_none=True)`, forward with labels, backward, `SGD.step()`, "
        f"`xlanb.sync()`; {STEPS} steps in lazy and in eager mode.", "",
        "- **status**: a training step's loss and every gradient match CPU torch in lazy, "
        "eager and op-by-op mode; `CPU:` names the ops that ran on CPU torch (with a "
        "warning at the model's line: values stay right, the data goes to the host and "
        "back, a sync each);",
        f"- **worst**: the largest |xla - cpu| / (atol + rtol |cpu|) over the loss "
        f"(atol, rtol = {LOSS_TOL}) and every gradient ({GRAD_TOL}), in any mode: at most 1 "
        "passes;",
        "- **graphs**: lazy mode's graphs compiled / found in the compile cache in the "
        "second step; **syncs**: that step's syncs, its own included: more than 1 are "
        "syncs inside the step (a value read on the host, a CPU fallback's inputs); where "
        "a sync ran its graph as segments (shapes that changed) the graph runs follow;",
        "- **eager compiles**: eager mode's runs compiled as one graph / single-op "
        "executables compiled, in the second step;",
        "- **steady from**: the first step from which nothing compiles. Eager mode may "
        "compile at steps 2-3: ops seen in three runs get executables of their own "
        "(`XLANB_TIER_UP`), which regroups the runs that compile together.", "",
        "| architecture | family | status | worst | graphs (lazy) | syncs (lazy) "
        "| steady from (lazy) | eager compiles | steady from (eager) | notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows, "",
        NOTES,
        END,
    ])


NOTES = """\
**Syncs inside a step.** Most models here given an `attention_mask` sync once or twice
per forward: with SDPA, transformers asks whether the mask can be skipped
(`masking_utils._ignore_causal_mask_sdpa` / `_ignore_bidirectional_mask_sdpa`: `mask.all()`
read on the host). A mask with no padding can be left out (no read), or
`attn_implementation="eager"` builds the mask without reading it: either way the step is
one graph. Models with a sliding window (Mistral, Gemma 2) always build the mask and never
read it.

**Data-dependent routing (MoE).** transformers' default experts (`grouped_mm`) sort the
tokens by expert, count them with `torch.histc` and multiply by `torch._grouped_mm` on the
offsets: all lowered, nothing read on the host, so an MoE step is one graph like a dense
model's (its syncs above are the mask's). (Before issue 58 `_grouped_mm` ran on CPU torch
in float32, torch's meta kernel being CUDA's: 12 calls on CPU torch and 21 graphs in a
step of the 2-layer Mixtral here, against 3 now.)
`config._experts_implementation = "batched_mm"` gathers each token's expert weights
instead: static shapes too, more memory. The eager experts (`"eager"`, transformers'
loop over the experts hit) read the routing on the host, in the forward: `nonzero` for
the experts hit, then for each expert the `expert_idx == num_experts` test, `torch.where`'s
`nonzero` (a CPU fallback: its shape depends on values) and the reads after it: 13 syncs
per MoE layer of 4 experts here; and every expert's token count is a shape, so graphs
compile at every step as the routing moves (row `mixtral_eager_experts`: 41 of its 93
graph runs compiled in step 2). Keep transformers' default, or `batched_mm`, on xla.

**Eager mode's compiles** settle by step 2 or 3 (Mixtral's by step 4 in a longer run):
an op seen in three runs gets an executable of its own, and the runs around it compile
again once without it. Lazy mode's step 2 compiles nothing but for wav2vec2's last graph
(one getitem of the feature encoder's GroupNorm fewer than step 1's; not looked into
further), steady from step 3."""


def write_section(text: str, path: str = DOC) -> None:
    """Replace the section between the markers (or put it before "## Every op")."""
    with open(path) as f:
        doc = f.read()
    if BEGIN in doc:
        head, rest = doc.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        doc = head + text + tail
    else:
        head, sep, tail = doc.partition("## Every op")
        doc = head + text + "\n\n" + sep + tail
    with open(path, "w") as f:
        f.write(doc)


def _run_worker(name: str, env: dict) -> dict:
    import json
    import subprocess
    proc = subprocess.run([sys.executable, "-m", "tools.model_zoo", "--worker", name],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.model_zoo",
                                description=__doc__.split("\n")[0])
    p.add_argument("--only", help="comma-separated architecture names")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return _worker(a.worker)
    import tempfile
    names = a.only.split(",") if a.only else [x.name for x in ZOO]
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="xlanb-zoo-store-") as store:
        # an empty executable store of its own: the user's is left alone
        env = dict(os.environ, XLANB_STORE_DIR=store, PYTHONWARNINGS="ignore")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
        for name in names:
            rows.append(_row(BY_NAME[name], _run_worker(name, env)))
            print(rows[-1], f"({time.perf_counter() - t0:.0f} s)", flush=True)
    text = section(rows, time.perf_counter() - t0)
    if a.no_write or a.only:
        print(text)
    else:
        write_section(text)
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
