"""Bits per byte over the bytes a tokenizer gives back: the sidecars' `n_bytes_decoded` beside `n_bytes`.

`n_bytes` counts the UTF-8 bytes of the source text (the rows, plus the regex stream's joins); `n_bytes_decoded` counts
those of `tok.decode(ids)`, where an `<unk>` gives back no byte and characters that no regex token matches were never
encoded. A tiny local corpus in `tmp_path` stands in for WikiText: no corpus, no network.
"""

import json

import numpy as np
import pytest

ROWS = [  # rare words become <unk>; 'ō', '東京', 'é' match no regex token (non-ASCII letters are dropped)
    ' = Senjō = \n',
    '',
    ' the cat sat on the mat . \n',
    ' the dog sat on the cat . \n',
    ' a café in 東京 , the cat ran . \n',
    ' zebra quokka the mat . \n',
]


@pytest.fixture
def tiny(tmp_path):
    "A local copy `tmp_path/copy/tiny/{train,validation,test}.txt` and a recipe for `tokenizer` on it."
    from looped_lm.core.config import load_preset

    for s in ('train', 'validation', 'test'):
        (tmp_path / 'copy' / 'tiny').mkdir(parents=True, exist_ok=True)
        (tmp_path / 'copy' / 'tiny' / f'{s}.txt').write_text(''.join(r or '\n' for r in ROWS * 3), encoding='utf-8')
    return lambda tokenizer, vocab: load_preset(
        'smoke', corpus='tiny', tokenizer=tokenizer, vocab_size=vocab, max_train_lines=0
    )


def source_text(td, s, join):
    "The text the split's `n_bytes` counts: its non-blank rows joined by `join`."
    from looped_lm.training.text import iter_rows, load_corpus

    return join.join(r for r in iter_rows(load_corpus('tiny', td.cache_dir.parents[1] / 'copy', verbose=False)[s]) if r)


def test_regex_counts_the_decodable_bytes(tiny, tmp_path):
    "Regex: n_bytes_decoded = bytes of decode(ids) = source bytes less those under <unk> and those no token matches."
    from looped_lm.training.data import prepare_data
    from looped_lm.training.text import SPLITS
    from looped_lm.training.text import REGEX_JOIN

    td = prepare_data(tiny('regex', 16), data_dir=tmp_path / 'copy', cache_dir=tmp_path / 'cache', verbose=False)
    tok = td.tokenizer
    for s in SPLITS:
        ids = td.split(s).tolist()
        text = source_text(td, s, REGEX_JOIN)
        toks = tok.tokenize(text)
        unk_bytes = sum(len(t.encode()) for t in toks if t not in tok.stoi)
        dropped = len(text.encode()) - sum(len(t.encode()) for t in toks)
        assert td.n_bytes[s] == len(text.encode())  # unchanged: the source bytes
        assert td.n_bytes_decoded[s] == len(tok.decode(ids).encode())
        assert td.n_bytes_decoded[s] == td.n_bytes[s] - unk_bytes - dropped
        assert unk_bytes > 0 and dropped == 3 * len('ō東京é'.encode())  # 3 copies of the rows
    print(td.n_bytes, td.n_bytes_decoded, f"<unk> {np.mean(td.validation == tok.unk_id):.1%}")


def test_bpe_gives_back_every_byte(tiny, tmp_path):
    "Byte-level BPE: every source byte comes back, so n_bytes_decoded == n_bytes (the EOTs add none)."
    from looped_lm.training.data import prepare_data
    from looped_lm.training.text import SPLITS

    td = prepare_data(tiny('bpe', 300), data_dir=tmp_path / 'copy', cache_dir=tmp_path / 'cache', verbose=False)
    for s in SPLITS:
        assert (td.split(s) == td.eot_id).sum() == 1  # one EOT (only the first title sits between blank rows) ...
        assert td.n_bytes_decoded[s] == td.n_bytes[s] == len(source_text(td, s, '').encode())  # ... and add no byte
    print(td.n_bytes_decoded)


def test_sidecar_without_the_count_is_read_not_rebuilt(tiny, tmp_path):
    "A sidecar written before n_bytes_decoded existed stays a cache hit; the count comes from the cached ids."
    from looped_lm.training.data import prepare_data

    cfg = tiny('regex', 16)
    kw = dict(data_dir=tmp_path / 'copy', cache_dir=tmp_path / 'cache', verbose=False)
    td = prepare_data(cfg, **kw)
    for sidecar in td.cache_dir.glob('*-*.json'):
        if sidecar.name.startswith(('train-', 'validation-', 'test-')):
            meta = json.loads(sidecar.read_text())
            del meta['n_bytes_decoded']
            sidecar.write_text(json.dumps(meta))
    old = prepare_data(cfg, **kw)
    assert old.built == () and not old.tokenizer_trained and old.fingerprint == td.fingerprint
    assert old.n_bytes_decoded == td.n_bytes_decoded and old.n_bytes == td.n_bytes
    print(old.n_bytes_decoded)
