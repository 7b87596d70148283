"""Diagnostics of looped models published by others, installed from PyPI: every number recomputed here.

Two looped-depth models written by others, each trained a few hundred steps on a small committed text
(`tests/fixtures/outside_text.txt`, characters as tokens), described through the specs of `nbs/03d_outside.ipynb`
(`from_open_mythos`, `from_tiny_recursive`: three callables each, as a user would write them), diagnosed with the
library, and every diagnostic recomputed in this file on the model's own forward, without the library:

- OpenMythos (`open-mythos`, The-Swarm-Corporation/OpenMythos, MIT): a recurrent-depth transformer: prelude, one
  recurrent block with input re-injection, ACT halting that reads out a halting-weighted sum of the loop states, an
  MoE feed-forward, a coda. The halting sums are a context the loop updates (one entry per loop).
- TinyRecursiveModel (`tiny-recursive-model`, lucidrains, MIT) with an `x-transformers` causal decoder as its shared
  network: a state of two tensors (answer and latent; the latent rides in the context, one entry per loop) over
  register tokens plus the tokens, so the state holds more positions than the tokens.

And one model that loops over blocks of the sequence, not over depth (`block-recurrent-transformer-pytorch`,
lucidrains): refused before any work, with the reason and what to measure instead.

The packages are test-only dependencies, pinned in `tests/outside-models.txt` and installed by `scripts/setup.sh`
with `--no-deps` (open-mythos pins another torch); each test skips, naming the install line, when one is missing.
"""

import copy, time
from pathlib import Path

import numpy as np
import pytest
import torch, torch.nn.functional as F

from looped_lm.measure.protocol import LoopSpec, LoopSpecError, run_loops
from looped_lm.measure.spec_checks import check_spec
from looped_lm.measure.hooks import from_hooks
from looped_lm.measure.diagnostics import clamp_modes, eval_exits, token_norms
from looped_lm.measure.outside import from_open_mythos, from_tiny_recursive
from looped_lm.measure.radial import radial_fractions

INSTALL = "pip install --no-deps -r tests/outside-models.txt (scripts/setup.sh does it)"
TEXT = (Path(__file__).parent / 'fixtures' / 'outside_text.txt').read_text()
CHARS = sorted(set(TEXT))
IDS = np.array([CHARS.index(c) for c in TEXT], dtype=np.int64)
V, SEQ, BATCH, BATCHES = len(CHARS), 32, 4, 2  # the diagnosed windows: 2 batches of 4 windows of 32 characters


def need(module: str):
    "The installed package `module`, or a skip that names the install line."
    return pytest.importorskip(module, reason=f"{module} is not installed: {INSTALL}")


def train(model, loss_fn, steps: int, lr: float = 3e-3, seed: int = 0):
    "A few hundred Adam steps on random windows of the fixture text; returns the model in eval mode."
    gen, opt = torch.Generator().manual_seed(seed), torch.optim.Adam(model.parameters(), lr=lr)
    ids = torch.as_tensor(IDS)
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - SEQ - 1, (8,), generator=gen)
        w = torch.stack([ids[s : s + SEQ + 1] for s in starts.tolist()])
        opt.zero_grad()
        loss_fn(model, w[:, :-1], w[:, 1:]).backward()
        opt.step()
    return model.eval()


def windows():
    "The (x, y) windows the library's diagnostics read (`token_windows`), cut here by hand."
    n = BATCH * BATCHES
    ids = torch.as_tensor(IDS)
    x, y = ids[: n * SEQ].view(n, SEQ), ids[1 : n * SEQ + 1].view(n, SEQ)
    return list(zip(x.split(BATCH), y.split(BATCH)))


def hand_radial(grads_and_states) -> tuple:
    """(mean of |cos(g, H)| over every batch's tokens whose gradient is not zero, number of tokens whose gradient is
    zero): the radial fraction written out, float64."""
    cosines, dead = [], 0
    for g, h in grads_and_states:
        live = g.abs().amax(-1) > 0
        dead += int((~live).sum())
        cosines.append(((g * h).sum(-1).abs() / (g.norm(dim=-1) * h.norm(dim=-1)))[live])
    every = torch.cat(cosines)
    return (every.mean().item() if len(every) else None), dead


def rel(a, b) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


# ---------------------------------------------------------------- OpenMythos: ACT halting, a context the loop updates


def mythos_states(m, t, n_loops=None, leaf_at: int = None) -> list:
    """The states of the model's own forward (a hook on its LTIInjection, which outputs h every loop); with `leaf_at`,
    the state of that loop (1-based) is replaced by a leaf that requires grad, which the forward then uses."""
    hs = []

    def hook(mod, args, out):
        if len(hs) + 1 == leaf_at:
            out = out.detach().requires_grad_()
        hs.append(out)
        return out

    handle = m.recurrent.injection.register_forward_hook(hook)
    try:
        logits = m(t, n_loops=n_loops)
    finally:
        handle.remove()
    return hs if leaf_at is None else (hs, logits)


@pytest.fixture(scope='module')
def mythos():
    om = need('open_mythos')
    torch.manual_seed(0)
    cfg = om.MythosConfig(
        vocab_size=V, dim=32, n_heads=4, n_kv_heads=2, max_seq_len=64, max_loop_iters=4, prelude_layers=1,
        coda_layers=1, attn_type='gqa', n_experts=4, n_shared_experts=1, n_experts_per_tok=2, expert_dim=16,
        lora_rank=4, rope_theta=10000.0,
    )  # fmt: skip
    ce = lambda m, x, y: F.cross_entropy(m(x).flatten(0, 1), y.flatten())
    t0 = time.perf_counter()
    model = train(om.OpenMythos(cfg), ce, steps=150)
    return model, time.perf_counter() - t0


def test_mythos_spec_reproduces_the_model_and_passes_the_checks(mythos):
    m, _ = mythos
    spec, x = from_open_mythos(m), windows()[0][0]
    r = check_spec(spec, x)
    assert r['forward_rel_diff'] < 1e-6 and r['exit_rel_diff'] < 1e-5, r
    assert r['readout_uses_k'] and r['steps_carry_state']
    hs = run_loops(spec, x, 4)[0]
    with torch.no_grad():
        own = mythos_states(m, x)
    for a, b in zip(hs, own):  # the model's forward may stop early once every token halted
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_mythos_diagnostics_equal_the_recomputation(mythos):
    m, _ = mythos
    spec, ws, K = from_open_mythos(m), windows(), m.cfg.max_loop_iters
    ids = IDS[: BATCH * BATCHES * SEQ + 1]
    exits = eval_exits(spec, ids, BATCH, SEQ)
    norms = token_norms(spec, ids, BATCH, SEQ)
    radial = radial_fractions(spec, ids, BATCH, SEQ, max_batches=BATCHES)
    m64 = copy.deepcopy(m).double()
    for k in range(1, K + 1):
        with torch.no_grad():  # exit k: the model's own forward with n_loops=k, and its own states
            ce = np.mean([F.cross_entropy(m(x, n_loops=k).flatten(0, 1), y.flatten()).item() for x, y in ws])
            own = torch.cat([torch.stack(mythos_states(m, x, n_loops=K))[k - 1] for x, _ in ws])
        assert rel(exits[k - 1]['ce'], ce) < 1e-6
        np.testing.assert_allclose(norms[k - 1], own.double().norm(dim=-1).flatten().numpy(), rtol=1e-6)
        pairs = []
        for x, y in ws:  # d CE(exit k) / d H_k through the model's own forward, float64
            hs, logits = mythos_states(m64, x, n_loops=k, leaf_at=k)
            leaf = hs[k - 1] if len(hs) >= k else None  # None: every token halted before loop k, the forward stopped
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            g = torch.autograd.grad(loss, leaf)[0] if leaf is not None else None
            pairs.append((g if g is not None else torch.zeros(x.shape + (32,), dtype=torch.float64), leaf.detach()))
        frac, dead = hand_radial(pairs)
        row = radial[k - 1]  # the ACT code casts its running mask with .float() (exact 0/1): the row says so
        assert row['dtype'] == 'float32/float64' and row['zero_grad_tokens'] == dead
        assert (row['readout'] is None) == (frac is None) and (frac is None or rel(row['readout'], frac) < 1e-9)


# --------------------------------------------- TinyRecursiveModel: a state of two tensors, register tokens in front


@pytest.fixture(scope='module')
def trm():
    tr, xt = need('tiny_recursive_model'), need('x_transformers')
    torch.manual_seed(0)
    net = xt.Decoder(dim=32, depth=1, heads=2, rotary_pos_emb=True)
    model = tr.TinyRecursiveModel(
        dim=32, num_tokens=V, network=net, num_refinement_blocks=2, num_latent_refinements=2, num_register_tokens=2
    )

    def deep_supervision(m, x, y, steps=3):  # the paper's recipe: a loss per supervision step, state detached between
        out, lat = m.get_initial()
        total = 0.0
        for _ in range(steps):
            loss, _, out, lat, _, _ = m(x, out, lat, labels=y)
            total = total + loss / x.numel()
        return total

    t0 = time.perf_counter()
    model = train(model, deep_supervision, steps=150)
    return model, time.perf_counter() - t0


@pytest.mark.slow
def test_trm_context_is_probed_at_the_tokens_length(trm):
    "The state holds 2 registers + 31 positions; today's probe built contexts of 33 tokens and died inside the check."
    m, _ = trm
    r = check_spec(from_tiny_recursive(m, 3), windows()[0][0])
    assert r['exit_rel_diff'] < 1e-5 and r['slice_rel_diff'] < 1e-6 and r['scale_invariant'] is False


def test_trm_diagnostics_equal_the_recomputation(trm):
    m, _ = trm
    K, ws = 3, windows()
    spec, ids = from_tiny_recursive(m, K), IDS[: BATCH * BATCHES * SEQ + 1]
    exits, norms = eval_exits(spec, ids, BATCH, SEQ), token_norms(spec, ids, BATCH, SEQ)
    radial = radial_fractions(spec, ids, BATCH, SEQ, max_batches=BATCHES)
    mean_norms = [r['norm_l2'] for r in clamp_modes(spec, ids, BATCH, SEQ, modes=('none',))['none']]
    m64 = copy.deepcopy(m).double()
    own = {}  # per window batch: the answers y_1..y_K of the model's own forwards (float32 and float64)
    for i, (x, _) in enumerate(ws):
        for name, mod in (('32', m), ('64', m64)):
            y, z, seq = *mod.get_initial(), []
            with torch.no_grad():
                for _ in range(K):
                    y, z, pred, _ = mod(x, y, z)
                    seq.append((y, pred))
            own[name, i] = seq
    for k in range(1, K + 1):
        ce = np.mean(
            [F.cross_entropy(own['32', i][k - 1][1].flatten(0, 1), y.flatten()).item() for i, (_, y) in enumerate(ws)]
        )
        assert rel(exits[k - 1]['ce'], ce) < 1e-6
        states = torch.cat([own['32', i][k - 1][0] for i in range(len(ws))])
        np.testing.assert_allclose(norms[k - 1], states.double().norm(dim=-1).flatten().numpy(), rtol=1e-6)
        assert rel(mean_norms[k - 1], states.double().norm(dim=-1).mean().item()) < 1e-6  # over 34 positions, not 32
        pairs = []
        for i, (x, y) in enumerate(ws):  # d CE / d y_k of the model's own prediction head, float64
            leaf = own['64', i][k - 1][0].clone().requires_grad_()
            loss = F.cross_entropy(m64.to_pred(leaf[:, 2:]).flatten(0, 1), y.flatten())  # the head, not the registers
            pairs.append((torch.autograd.grad(loss, leaf)[0], leaf.detach()))
        frac, dead = hand_radial(pairs)
        row = radial[k - 1]
        assert row['dtype'] == 'float64' and row['zero_grad_tokens'] == dead == 2 * BATCH * BATCHES  # the registers
        assert rel(row['readout'], frac) < 1e-9


def trm_keyed(m, K: int) -> LoopSpec:
    "TinyRecursiveModel described as a user would with `state_key`: the pair (y, z) is the state, y is measured."
    R = m.register_tokens.shape[0]

    def init(t):
        inputs, _ = m.embed_inputs_with_registers(t)
        return dict(zip('yz', (v.expand_as(inputs) for v in m.get_initial()))), inputs

    def step(s, inputs, k):
        y, z = s['y'], s['z']
        for _ in range(m.num_refinement_blocks):
            y, z = m.refine_latent_then_output_once(inputs, y, z)
        return dict(y=y, z=z)

    return LoopSpec(init, step, lambda s, inputs, k: m.to_pred(s['y'][:, R:]), K, 'TRM keyed', 'the answer y',
                    modules=(m,), state_key='y')  # fmt: skip


def test_trm_with_a_keyed_state_gives_the_numbers_of_the_hand_written_spec(trm):
    "The pair as the state (state_key='y') against the chapter's spec (y the state, z in the context): equal numbers."
    m, _ = trm
    ids = IDS[: BATCH * BATCHES * SEQ + 1]
    for fn in (eval_exits, token_norms, radial_fractions):
        a, b = fn(trm_keyed(m, 3), ids, BATCH, SEQ), fn(from_tiny_recursive(m, 3), ids, BATCH, SEQ)
        if fn is token_norms:
            np.testing.assert_array_equal(a, b)
        else:
            for ra, rb in zip(a, b):
                assert {c: v for c, v in ra.items() if c != 'name'} == {c: v for c, v in rb.items() if c != 'name'}


# ------------------------------------------------- a loop over blocks of the sequence: refused before any work


def test_a_loop_over_blocks_of_the_sequence_is_refused_before_any_work():
    brt = need('block_recurrent_transformer_pytorch')
    torch.manual_seed(0)
    m = brt.BlockRecurrentTransformer(
        num_tokens=V, dim=16, depth=2, dim_head=8, heads=2, max_seq_len=SEQ, block_width=8, num_state_vectors=4
    ).eval()
    # the attention block runs once per block of 8 tokens: hooked as if it were a loop over depth
    spec = from_hooks(m, m.layers[0][0], lambda h, ctx, k: m.to_logits(h), K=SEQ // 8, state='block output')
    for diagnose in (lambda: check_spec(spec, windows()[0][0]), lambda: radial_fractions(spec, IDS, BATCH, SEQ)):
        with pytest.raises(LoopSpecError, match='blocks of the SEQUENCE') as e:
            diagnose()
        assert 'holds 8 positions for' in str(e.value)
        assert 'the CE per block of the sequence' in str(e.value)  # what to measure instead


# ------------------------------------------------------------ the probe of the context, on hand-written specs


def positional_spec(R: int = 1, max_len: int = SEQ) -> LoopSpec:
    "A spec whose state holds R register positions before the tokens, with a learned position table of max_len rows."
    torch.manual_seed(0)
    emb, pos, reg, mix = (
        torch.nn.Embedding(V, 8), torch.randn(max_len, 8), torch.randn(R, 8), torch.nn.Linear(8, 8)
    )  # fmt: skip

    def init(t):
        x = emb(t) + pos[: t.shape[1]]  # a window longer than max_len cannot be embedded
        return torch.cat([reg.expand(len(t), R, 8), x], 1), dict(x=x)

    return LoopSpec(
        init, lambda h, c, k: h + torch.tanh(mix(h)) + F.pad(c['x'], (0, 0, R, 0)),
        lambda h, c, k: h[:, R:] @ emb.weight.T, K=3, state='h over the register and token positions',
    )  # fmt: skip


def test_the_context_probe_builds_contexts_of_the_tokens_length():
    "Failed on earlier code: the probe asked init for 33 tokens (the state's length) and died."
    x = torch.as_tensor(IDS[: 2 * (SEQ + 1)]).view(2, SEQ + 1)  # 32 inputs + 1 target: the position table's length
    r = check_spec(positional_spec(), x)
    assert r['slice_rel_diff'] < 1e-6


def test_a_failing_user_function_is_named_with_its_loop():
    spec = positional_spec(max_len=8)  # windows of 32 tokens cannot be embedded
    with pytest.raises(LoopSpecError, match=r'LoopSpec.init raised RuntimeError at k=0 .* must match'):
        check_spec(spec, torch.as_tensor(IDS[:66]).view(2, 33))


def growing_spec() -> tuple:
    "(spec, its embedding): a context the loop grows, a halting-style running sum, one entry per loop, read at loop k."
    torch.manual_seed(0)
    emb, mix = torch.nn.Embedding(V, 8), torch.nn.Linear(8, 8)

    def step(h, c, k):
        if k > 1:
            c['sums'][k - 1 :] = [c['sums'][k - 2] + h]
        return h + torch.tanh(mix(h))

    return LoopSpec(
        lambda t: (emb(t), dict(sums=[torch.zeros(*t.shape, 8)])), step,
        lambda h, c, k: (c['sums'][k - 1] + h) @ emb.weight.T, K=4, readout_uses_k=True,
        state='h; the readout reads the running sum of the states up to loop k',
    ), emb  # fmt: skip


def test_a_context_the_loop_grows_is_sliced_without_slice_ctx():
    "Failed on earlier code: the context holds 5 tensors after 4 loops, its probe of init found 1."
    (spec, emb), ids = growing_spec(), IDS[: 4 * SEQ + 1]
    assert check_spec(spec, windows()[0][0])['slice_rel_diff'] < 1e-6
    whole, pieces = eval_exits(spec, ids, 4, SEQ), eval_exits(spec, ids, 4, SEQ, ce_chunk=SEQ)  # one sequence a piece
    assert [round(a['ce'], 6) for a in whole] == [round(b['ce'], 6) for b in pieces]
    x, y = windows()[0]
    with torch.no_grad():  # by hand: the running sum of the states
        hs = run_loops(spec, x, 4)[0]
        for k in range(1, 5):
            logits = sum(hs[:k]) @ emb.weight.T
            assert abs(F.cross_entropy(logits.flatten(0, 1), y.flatten()).item() - whole[k - 1]['ce']) < 1e-5
