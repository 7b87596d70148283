"Pilot of the k-hop task (seed 0, never a study seed): does a one-layer stack looped 4 times learn it in 1,000 steps?"

import sys, time, numpy as np, torch
from pathlib import Path
from looped_lm.extensions.depth import check_depth, khop_data, DEPTH_VARIANTS
from looped_lm.training.train import train
from looped_lm.training.rundir import load_run


def answer_ce(model, tokens, K, n_sym=16, seq_len=64, n_ep=400):
    "CE on answer tokens per exit and per hop count (k = 1..4) on the first n_ep validation episodes."
    x = torch.from_numpy(tokens[: n_ep * seq_len].astype(np.int64)).view(n_ep, seq_len)
    out = {}
    with torch.no_grad():
        for k in range(1, K + 1):
            logits = model(x, exit_k=k, return_logits=True).logits  # (B, T, V)
            lp = torch.log_softmax(logits.float(), -1)
            pos = torch.arange(n_sym + 1, seq_len, 3)  # q positions: predict the answer
            tgt = x[:, pos + 1]
            ce = -lp[:, pos].gather(-1, tgt[..., None])[..., 0]
            hop = x[:, pos - 1] - (n_sym + n_sym**2) + 1
            out[k] = {h: round(float(ce[hop == h].mean()), 3) for h in range(1, 5)}
    return out


if __name__ == '__main__':
    torch.set_num_threads(1)
    variants = sys.argv[1].split(',')
    plan = check_depth('khop', out_dir='/tmp/khop/pilot')
    data = khop_data()
    for v in variants:
        cfg = DEPTH_VARIANTS[v].config(plan.base.replace(n_layers=1)).replace(seed=0)
        rd = Path(f'/tmp/khop/pilot/{v}-seed0')
        t0 = time.time()
        r = train(cfg, rd, data=data, progress=False)
        _, m = load_run(rd)
        print(
            v,
            f'{time.time() - t0:.0f}s',
            'val CE/exit',
            [round(x, 3) for x in r.eval['loss']],
            'answer CE by exit, hop:',
            answer_ce(m, data.validation, cfg.K),
            flush=True,
        )
