"""Data integrity (Reliability II, items 1, 2, 3, 6, 8; the official regex recipe; shared token caches).

Each test builds its own tiny local corpus and cache in `tmp_path`, so they run in seconds and never touch the
session's WikiText caches. The concurrency tests use real processes.
"""

import errno, json, math, os, signal, socket, subprocess, sys, textwrap, time
from pathlib import Path
import numpy as np, pytest, torch

import looped_lm.core.files as F
from looped_lm.core.config import load_preset
from looped_lm.training.data import bits_per_byte, window_batch, window_starts, word_perplexity
from looped_lm.training.text import DataNotFoundError
from looped_lm.training.data import prepare_data
from looped_lm.core.files import LockedError, WriteError, dir_lock, sweep_stale_tmp, write_atomic
from looped_lm.training.text import RegexTokenizer

SPLITS = ('train', 'validation', 'test')
WORDS = 'alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu'.split()


def make_corpus(root: Path, name='tiny', upper=False, rows=120):
    "A local corpus of `rows` short lines per split (a blank line every fifth row), optionally upper-cased."
    for k, s in enumerate(SPLITS):
        lines = [
            ' \n' if i % 5 == 0 else ' ' + ' '.join(WORDS[(i * j + k) % len(WORDS)] for j in range(1, 9)) + ' .\n'
            for i in range(rows)
        ]
        text = ''.join(lines)
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / f'{s}.txt').write_text(text.upper() if upper else text, encoding='utf-8')
    return root


def tiny_cfg(tokenizer='bpe', name='tiny'):
    return load_preset('smoke').replace(
        corpus=name, tokenizer=tokenizer, vocab_size=300 if tokenizer == 'bpe' else 40, max_train_lines=0, min_freq=2
    )


# ---- item 1: a changed corpus is never read from a stale cache ------------------------------------------------


@pytest.mark.parametrize('tokenizer', ['bpe', 'regex'])
def test_changed_text_rebuilds_tokenizer_and_caches(tmp_path, tokenizer):
    data, cache, cfg = make_corpus(tmp_path / 'data'), tmp_path / 'cache', tiny_cfg(tokenizer)
    old = prepare_data(cfg, data_dir=data, cache_dir=cache, verbose=False)
    assert old.tokenizer_trained and old.built == SPLITS
    again = prepare_data(cfg, data_dir=data, cache_dir=cache, verbose=False)
    assert (again.fingerprint, again.built, again.tokenizer_trained) == (old.fingerprint, (), False)
    make_corpus(tmp_path / 'data', upper=True)  # same folder, same file names, new text
    new = prepare_data(cfg, data_dir=data, cache_dir=cache, verbose=False)
    assert new.fingerprint != old.fingerprint and new.source != old.source
    assert new.tokenizer_trained and new.built == SPLITS
    assert new.tokenizer_file != old.tokenizer_file
    decoded = new.tokenizer.decode(new.validation[:80].tolist())
    assert 'ALPHA' in decoded or 'BETA' in decoded or 'GAMMA' in decoded, decoded
    assert not any(w in decoded for w in WORDS), decoded


def test_file_hash_is_remembered_by_size_and_mtime(tmp_path, monkeypatch):
    p = tmp_path / 'f.txt'
    p.write_text('hello')
    memo = tmp_path / 'memo.json'
    first = F.file_content_sha(p, memo)
    F._FILE_HASHES.clear()
    monkeypatch.setattr(F, 'file_sha256', lambda p: pytest.fail('hashed again although size and mtime are unchanged'))
    assert F.file_content_sha(p, memo) == first  # read back from the memo file
    monkeypatch.undo()
    p.write_text('HELLO')
    assert F.file_content_sha(p, memo) != first


# ---- item 7 of the data task: any corpus from a local copy, only WikiText from the Hub ------------------------


def test_custom_corpus_needs_a_local_copy(tmp_path, monkeypatch):
    monkeypatch.setenv('LOOPED_LM_DATA', '')
    with pytest.raises(DataNotFoundError, match='needs a local copy'):
        prepare_data(tiny_cfg(name='my.corpus-1'), cache_dir=tmp_path / 'cache', verbose=False)
    td = prepare_data(
        tiny_cfg(name='my.corpus-1'),
        data_dir=make_corpus(tmp_path / 'd', 'my.corpus-1'),
        cache_dir=tmp_path / 'cache',
        verbose=False,
    )
    assert td.corpus == 'my.corpus-1' and len(td.train) > 0


# ---- shared caches: two processes preparing one cache at once ---------------------------------------------------

PREPARE = textwrap.dedent("""
    import json, sys
    from looped_lm.core.config import load_preset
    from looped_lm.training.data import prepare_data
    cfg = load_preset('smoke').replace(
        corpus='tiny', tokenizer=sys.argv[3], vocab_size=300 if sys.argv[3] == 'bpe' else 40, max_train_lines=0
    )
    td = prepare_data(cfg, data_dir=sys.argv[1], cache_dir=sys.argv[2], verbose=False)
    print(json.dumps(dict(fp=td.fingerprint, trained=td.tokenizer_trained, built=list(td.built),
                          ids=td.validation[:50].tolist())))
""")


def _has_open(pid, path) -> bool:
    "Whether process `pid` has the file `path` open (Linux /proc)."
    try:
        return any(os.readlink(f'/proc/{pid}/fd/{fd}') == str(path) for fd in os.listdir(f'/proc/{pid}/fd'))
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path('/proc/self/fd').is_dir(), reason='needs Linux /proc to see who waits on the lock')
@pytest.mark.parametrize('tokenizer', ['bpe', 'regex'])
def test_two_processes_prepare_one_cache(tmp_path, tokenizer):
    data, cache = make_corpus(tmp_path / 'data', rows=3000), tmp_path / 'cache'
    with dir_lock(cache / 'tiny', 'token cache'):  # hold the cache until both processes queue on it, so they race
        procs = [
            subprocess.Popen(
                [sys.executable, '-c', PREPARE, str(data), str(cache), tokenizer],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        t0 = time.monotonic()
        while not all(_has_open(p.pid, (cache / 'tiny' / '.lock').resolve()) for p in procs):
            assert all(p.poll() is None for p in procs) and time.monotonic() - t0 < 300, (
                'a process did not reach the lock'
            )
            time.sleep(0.05)
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    res = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    assert res[0]['fp'] == res[1]['fp'] and res[0]['ids'] == res[1]['ids']
    assert sorted(r['trained'] for r in res) == [False, True]  # one built, the other read its result
    assert sorted(len(r['built']) for r in res) == [0, 3]
    assert not list((cache / 'tiny').glob('*.tmp'))
    td = prepare_data(tiny_cfg(tokenizer), data_dir=data, cache_dir=cache, verbose=False)
    assert (td.fingerprint, td.built, td.tokenizer_trained) == (res[0]['fp'], (), False)


# ---- items 3, 6, 8: atomic, durable writes with clear errors, and no leftovers ---------------------------------


def test_write_atomic_disk_full_names_file_and_fix(tmp_path, monkeypatch):
    p = tmp_path / 'metrics.jsonl'
    write_atomic(p, 'old\n')

    def full(fd):
        raise OSError(errno.ENOSPC, 'No space left on device')

    monkeypatch.setattr(os, 'fsync', full)
    with pytest.raises(WriteError) as e:
        write_atomic(p, 'new\n')
    msg = str(e.value)
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOSPC and e.value.filename == str(p)
    assert str(p) in msg and 'disk is full' in msg and 'free some space' in msg, msg
    monkeypatch.undo()
    assert p.read_text() == 'old\n'
    assert sorted(x.name for x in tmp_path.iterdir()) == ['metrics.jsonl']  # no temporary file left


def _read_only_folder(monkeypatch, folder):
    "Make `folder` behave as a read-only one does, for root too: creating a file there and removing one both fail."

    def refuse(path):
        if Path(path).parent == folder:
            raise OSError(errno.EROFS, 'Read-only file system', str(path))

    real_open, real_unlink = open, Path.unlink

    def ro_open(path, *a, **k):
        refuse(path)
        return real_open(path, *a, **k)

    def ro_unlink(self, *a, **k):
        refuse(self)
        return real_unlink(self, *a, **k)

    monkeypatch.setattr(F, 'open', ro_open, raising=False)  # what atomic_writer opens its temporary file with
    monkeypatch.setattr(Path, 'unlink', ro_unlink)


def test_write_atomic_in_a_read_only_folder_is_a_write_error(tmp_path, monkeypatch):
    "The cleanup of the temporary file fails there too; the error raised is still the WriteError that says why."
    p = tmp_path / 'diagnostics.json'
    write_atomic(p, 'old')
    _read_only_folder(monkeypatch, tmp_path)
    for write in (lambda: write_atomic(p, 'new'), lambda: F.atomic_writer(p).__enter__()):
        with pytest.raises(WriteError) as e:
            write()
        msg = str(e.value)
        assert e.value.errno == errno.EROFS and e.value.filename == str(p), msg
        assert f'Could not write {p} in the folder {tmp_path}: the file system is read-only' in msg, msg
        assert 'choose a folder on a writable disk' in msg, msg
    monkeypatch.undo()
    assert p.read_text() == 'old'


def test_diagnose_run_in_a_read_only_run_folder_is_a_write_error(tmp_path, smoke_data, monkeypatch):
    "Diagnostics computed, then written to a read-only run folder: the WriteError, not a raw OSError about a .tmp file."
    from looped_lm.measure.diagnostics import diagnose_run
    from looped_lm.training.train import train

    rd = tmp_path / 'run'
    train(load_preset('smoke', train_tokens=2560), rd, data=smoke_data, progress=False)  # 10 steps
    _read_only_folder(monkeypatch, rd)
    with pytest.raises(WriteError, match=f'Could not write {rd}/diagnostics.json in the folder {rd}: the file system'):
        diagnose_run(rd, smoke_data, max_batches=1)
    monkeypatch.undo()
    assert not (rd / 'diagnostics.json').exists() and not list(rd.glob('*.tmp'))


def test_write_atomic_fsyncs_file_and_folder(tmp_path, monkeypatch):
    synced, real = [], os.fsync

    def spy(fd):
        synced.append(os.path.isdir(f'/proc/self/fd/{fd}'))
        return real(fd)

    monkeypatch.setattr(os, 'fsync', spy)
    write_atomic(tmp_path / 'x.json', '{}')
    assert synced == [False, True]  # the file, then its folder


def test_temp_names_are_unique_per_call(tmp_path):
    names = {F._tmp_for(tmp_path / 'a.bin').name for _ in range(50)}
    assert len(names) == 50 and all(f'.{os.getpid()}.' in n for n in names)


def test_sweep_removes_only_dead_writers_tmp(tmp_path):
    dead = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True)
    dead_tmp = tmp_path / f'.train-x.bin.{int(dead.stdout)}.1a2b3c4d.tmp'
    live_tmp = F._tmp_for(tmp_path / 'train-x.bin')
    other = tmp_path / 'notes.tmp'  # no pid in the name: left alone ...
    for p in (dead_tmp, live_tmp, other):
        p.write_bytes(b'x' * 10)
    assert sweep_stale_tmp(tmp_path) == [dead_tmp]
    assert live_tmp.exists() and other.exists()
    old = time.time() - 3600
    os.utime(other, (old, old))
    assert sweep_stale_tmp(tmp_path, older_than=600) == [other]  # ... unless older than asked


def test_prepare_data_sweeps_a_killed_tokenization(tmp_path):
    data, cache = make_corpus(tmp_path / 'data'), tmp_path / 'cache'
    dead = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True)
    (cache / 'tiny').mkdir(parents=True)
    left = cache / 'tiny' / f'.train-0123.bin.{int(dead.stdout)}.deadbeef.tmp'
    left.write_bytes(b'\0' * 1000)
    prepare_data(tiny_cfg(), data_dir=data, cache_dir=cache, verbose=False)
    assert not left.exists() and not list((cache / 'tiny').glob('*.tmp'))


# ---- item 2: one writer per folder, proven with two real processes ---------------------------------------------

HOLD = (
    "import sys, time; from looped_lm.core.files import dir_lock\n"
    "with dir_lock(sys.argv[1], 'run'):\n print('held', flush=True); time.sleep(float(sys.argv[2]))"
)


def _holder(folder, seconds):
    p = subprocess.Popen([sys.executable, '-c', HOLD, str(folder), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == 'held'
    return p


def test_lock_refuses_second_process_and_frees_on_death(tmp_path):
    run = tmp_path / 'run'
    p = _holder(run, 120)
    try:
        with pytest.raises(LockedError) as e:
            with dir_lock(run):
                pass
        msg = str(e.value)
        assert f'pid {p.pid}' in msg and socket.gethostname() in msg and 'wait=True' in msg, msg
        assert isinstance(e.value, RuntimeError)
        p.send_signal(signal.SIGKILL)
        p.wait()  # the holder dies holding the lock
        with dir_lock(run) as info:
            assert info['pid'] == os.getpid()
            assert json.loads((run / '.lock').read_text())['pid'] == os.getpid()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.slow
def test_lock_waits_for_a_live_holder(tmp_path):
    run, mark = tmp_path / 'run', tmp_path / 'holder-finished'
    code = HOLD + f"\n open({str(mark)!r}, 'w').close()"  # the holder's last act inside its lock
    p = subprocess.Popen([sys.executable, '-c', code, str(run), '1'], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == 'held'
    with pytest.raises(LockedError):
        with dir_lock(run):
            pass
    with dir_lock(run, wait=True, timeout=120):
        assert mark.exists()  # we got in only after the holder's block ended
    assert p.wait() == 0


def test_nested_lock_in_one_process_is_a_clear_error(tmp_path):
    with dir_lock(tmp_path):
        with pytest.raises(LockedError, match='already holds'):
            with dir_lock(tmp_path):
                pass
    with dir_lock(tmp_path):
        pass  # released on exit


# ---- the regex tokenizer, checked by hand ------------------------------------------------------------------------


def test_regex_tokenizer_ids_by_hand():
    train = ['b a c a.\n', 'c b!\n', 'naïve d\n']  # ï is a word character no alternative matches: dropped
    val = ['a b\n']
    tok = RegexTokenizer.fit([train, val], vocab_size=10, min_freq=2)
    # counts: ' ' 6, 'a' 3, 'b' 3, '\n' 4, 'c' 2; once: '.', '!', 'na', 've', 'd'
    assert tok.itos == ['<pad>', '<bos>', '<eos>', '<unk>', ' ', '\n', 'a', 'b', 'c']
    assert tok.tokenize('naïve') == ['na', 've']
    assert tok.encode('a d.\n').ids == [6, 4, 3, 3, 5]  # d and . are unknown
    assert tok.encode('a\n\n\nb').ids == [6, 3, 7]  # a row-boundary run is <unk>
    assert RegexTokenizer.fit([train, val], vocab_size=6, min_freq=2).itos[4:] == [' ', '\n']  # cut to V - 4
    tied = RegexTokenizer.fit([['z y x y z x\n']], vocab_size=10, min_freq=2)
    assert tied.itos[4:] == [' ', 'x', 'y', 'z']  # equal counts: string order


# ---- strided windows: deterministic in (seed, step), every window once per epoch ---------------------------------


def test_window_batch_epochs_and_determinism():
    toy = np.arange(5000, dtype=np.uint16)
    starts = window_starts(len(toy), 256, 128)
    assert starts[0] == 0 and starts[-1] <= 5000 - 257 and starts[-1] + 128 > 5000 - 257
    n, B = len(starts), 5
    seen = torch.cat([window_batch(toy, B, 256, 128, 42, s)[0][:, 0] for s in range(-(-2 * n // B))]).tolist()
    assert sorted(seen[:n]) == starts.tolist() and sorted(seen[n : 2 * n]) == starts.tolist()
    a = window_batch(toy, B, 256, 128, 42, 7)
    code = (
        "import numpy as np, torch; from looped_lm.training.data import window_batch\n"
        "x, y = window_batch(np.arange(5000, dtype=np.uint16), 5, 256, 128, 42, 7); print(x[:, 0].tolist())"
    )
    other = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert json.loads(other.stdout) == a[0][:, 0].tolist()  # same batch in a fresh process: exact resume
    assert not torch.equal(a[0], window_batch(toy, B, 256, 128, 43, 7)[0])
    assert torch.equal(a[1][:, :-1], a[0][:, 1:])


def test_bits_per_byte_and_word_ppl_by_hand():
    assert math.isclose(bits_per_byte(100 * math.log(2), 50), 2.0)
    assert math.isclose(word_perplexity(10 * math.log(3), 5), 9.0)
    with pytest.raises(ValueError, match='at least one byte'):
        bits_per_byte(1.0, 0)
