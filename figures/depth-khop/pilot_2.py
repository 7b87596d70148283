"Pilot 2 (seed 0, never a study seed): which k-hop format does a one-layer stack looped 4 times learn in 1-3k steps?"

import sys, time, hashlib, numpy as np, torch
from pathlib import Path
from looped_lm.training.data import TokenData
from looped_lm.core.config import load_preset
from looped_lm.extensions.depth import DEPTH_VARIANTS
from looped_lm.training.train import train
from looped_lm.training.rundir import load_run


def episodes(n_ep, n_sym, hops, seq_len, seed, fmt):
    rng = np.random.default_rng(seed)
    head = n_sym if fmt == 'pair' else 2 * n_sym
    n_q = (seq_len - head) // 3
    assert head + 3 * n_q == seq_len, (fmt, n_sym)
    pi = np.argsort(rng.random((n_ep, n_sym)), axis=1)
    order = np.argsort(rng.random((n_ep, n_sym)), axis=1)
    y = np.take_along_axis(pi, order, 1)
    if fmt == 'pair':
        pairs, hop0 = n_sym + order * n_sym + y, n_sym + n_sym**2
    else:
        pairs, hop0 = np.stack([order, y], 2).reshape(n_ep, -1), n_sym
    k, q = rng.choice(np.asarray(hops), (n_ep, n_q)), rng.integers(0, n_sym, (n_ep, n_q))
    a = q.copy()
    for j in range(max(hops)):
        a = np.where(k > j, np.take_along_axis(pi, a, 1), a)
    qs = np.stack([hop0 + k - 1, q, a], 2).reshape(n_ep, -1)
    return np.concatenate([pairs, qs], 1).reshape(-1).astype(np.uint16), hop0 + max(hops), head


def data(n_sym, hops, fmt, seq_len=64):
    sp = {}
    for s, (n, seed) in dict(train=(16001 * 3, 0), validation=(1001, 1), test=(1001, 2)).items():
        sp[s], V, head = episodes(n, n_sym, hops, seq_len, seed, fmt)
    fp = hashlib.sha256(sp['train'][:1000].tobytes() + fmt.encode()).hexdigest()[:16]
    return TokenData(**sp, tokenizer=None, vocab_size=V, fingerprint=fp, cache_dir=None, corpus='khop'), head


def answer_ce(model, tokens, K, head, hop0, seq_len=64, n_ep=400):
    x = torch.from_numpy(tokens[: n_ep * seq_len].astype(np.int64)).view(n_ep, seq_len)
    out = {}
    with torch.no_grad():
        for k in range(1, K + 1):
            lp = torch.log_softmax(model(x, exit_k=k, return_logits=True).logits.float(), -1)
            pos = torch.arange(head + 1, seq_len, 3)
            ce = -lp[:, pos].gather(-1, x[:, pos + 1][..., None])[..., 0]
            hop = x[:, pos - 1] - hop0 + 1
            out[k] = [round(float(ce[hop == h].mean()), 2) for h in range(1, 5)]
    return out


if __name__ == '__main__':
    torch.set_num_threads(1)
    fmt, n_sym, lr, steps, variants = (
        sys.argv[1],
        int(sys.argv[2]),
        float(sys.argv[3]),
        int(sys.argv[4]),
        sys.argv[5].split(','),
    )
    hops = tuple(int(h) for h in (sys.argv[6] if len(sys.argv) > 6 else '1234'))
    td, head = data(n_sym, hops, fmt)
    hop0 = td.vocab_size - 4
    base = load_preset(
        'cpu',
        tokenizer='regex',
        corpus='khop',
        n_layers=1,
        vocab_size=td.vocab_size,
        stride=64,
        lr=lr,
        schedule='wsd',
        decay_steps=steps // 5,
        train_tokens=steps * 16 * 64,
        ckpt_every=steps,
        log_every=steps // 10,
    )
    for v in variants:
        cfg = DEPTH_VARIANTS[v].config(base).replace(seed=0)
        rd = Path(f'/tmp/khop/p2/{fmt}{n_sym}-h{len(hops)}-lr{lr}-s{steps}-{v}')
        t0 = time.time()
        r = train(cfg, rd, data=td, progress=False)
        _, m = load_run(rd)
        print(
            fmt,
            n_sym,
            lr,
            steps,
            v,
            f'{time.time() - t0:.0f}s',
            'val CE/exit',
            [round(x, 3) for x in r.eval['loss']],
            'answer CE [exit][hop1..4]:',
            answer_ce(m, td.validation, cfg.K, head, hop0),
            flush=True,
        )
