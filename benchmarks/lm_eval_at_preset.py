"""lm-evaluation-harness's bits per byte beside ours on a trained run of a preset, at that preset's context length,
with the gap taken apart (`nbs/07b_lm_eval.ipynb`'s comparison, as a committed record with its machine).

The default is the model the README reports: the main job's `perloop-rmsnorm` run (`cpu` preset, seed 1), scored on
the WikiText-2 test split with `max_length` = the preset's `seq_len` on both sides. Needs the `eval` extra.

    python benchmarks/lm_eval_at_preset.py                                   # results/cpu/runs/perloop-rmsnorm-seed1
    python benchmarks/lm_eval_at_preset.py --preset smoke --run DIR --limit 3 --out benchmarks/_out/lm_eval   # quick
"""

import argparse, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_lib import RESULTS, machine, write_json  # noqa: E402
from looped_lm.core.config import load_preset  # noqa: E402
from looped_lm.core.files import file_sha256  # noqa: E402
from looped_lm.training.data import prepare_data  # noqa: E402
from looped_lm.training.rundir import load_run, latest_checkpoint, read_json  # noqa: E402
from looped_lm.interop.lm_eval import save_run, wikitext_pages, harness_scores, compare_bpb  # noqa: E402


def score(preset: str, run_dir: Path, split: str, limit: int = None) -> dict:
    "The harness's metrics and our three numbers on `run_dir` (a trained run of `preset`), every document or `limit`."
    cfg = load_preset(preset)
    run_cfg = read_json(run_dir / 'config.json', None)
    if run_cfg is None or (run_cfg.get('name'), run_cfg.get('seq_len')) != (preset, cfg.seq_len):
        raise SystemExit(f"{run_dir} is not a trained run of the {preset!r} preset (its config.json) → pass --run.")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = prepare_data(cfg, verbose=False)
    pages = list(wikitext_pages(cfg.corpus, (split,))[split]['page'])[:limit]
    folder = save_run(run_dir, Path(tempfile.mkdtemp()) / 'hf')
    hf_model, hf_tok = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    docs = [hf_tok.encode(p) for p in pages]
    n_bytes = sum(len(p.encode('utf-8')) for p in pages)
    tokens = data.split(split)[: sum(len(d) + 1 for d in docs) + 1] if limit else data.split(split)
    t0 = time.time()
    h = harness_scores(hf_model, hf_tok, cfg.seq_len, split=split, limit=limit, batch_size=64)
    rows = compare_bpb(load_run(run_dir)[1], tokens, docs, data.eot_id, n_bytes, cfg.seq_len, h['bits_per_byte'])
    ckpt = latest_checkpoint(run_dir)
    return dict(
        preset=preset,
        run=str(run_dir),
        checkpoint=f"{ckpt.name}:{file_sha256(ckpt / 'model.safetensors')[:16]}",
        split=split,
        documents=len(pages),
        tokens=int(len(tokens)),
        bytes=n_bytes,
        context=cfg.seq_len,
        rows=rows,
        harness=dict(bits_per_byte=h['bits_per_byte'], word_perplexity=h['word_perplexity']),
        seconds=round(time.time() - t0, 1),
        machine=machine(),
    )


def markdown(r: dict) -> str:
    gap = r['rows'][-1]['bpb'] - r['rows'][0]['bpb']
    m = r['machine']
    lines = [
        f"# lm-evaluation-harness beside our bits per byte: `{r['preset']}` (`benchmarks/lm_eval_at_preset.py`)",
        '',
        f"Run `{r['run']}` (checkpoint `{r['checkpoint']}`), WikiText-2 {r['split']} split: {r['documents']} articles, "
        f"{r['tokens']:,} tokens, {r['bytes']:,} bytes; context {r['context']} tokens on both sides; the last loop.",
        f"Machine: {m['cpu']} ({m['cpu_capability']}), torch {m['torch']}, {m['torch_threads']} threads; "
        f"{r['seconds']:.0f} s.",
        '',
        '| | bits per byte | change |',
        '|---|---:|---:|',
    ]
    for row in r['rows']:
        change = '' if row['change'] is None else f"{row['change']:+.4f}"
        lines.append(f"| {row['what']} | {row['bpb']:.4f} | {change} |")
    lines += [
        '',
        f"Harness − ours as reported: {gap:+.4f} bits per byte ({gap / r['rows'][0]['bpb']:+.2%}); the harness's word "
        f"perplexity {r['harness']['word_perplexity']:,.1f} is over whitespace words of the page, not our `n_words`.",
    ]
    return '\n'.join(lines) + '\n'


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--preset', default='cpu')
    ap.add_argument('--run', default='results/cpu/runs/perloop-rmsnorm-seed1')
    ap.add_argument('--split', default='test')
    ap.add_argument('--limit', type=int, default=None, help='first documents only (a quick check)')
    ap.add_argument('--out', default=None, help=f'folder of lm_eval_<preset>.json/.md (default {RESULTS})')
    a = ap.parse_args()
    res = score(a.preset, Path(a.run), a.split, a.limit)
    out = Path(a.out or RESULTS)
    write_json(out / f'lm_eval_{a.preset}.json', res)
    (out / f'lm_eval_{a.preset}.md').write_text(markdown(res))
    print(markdown(res))
