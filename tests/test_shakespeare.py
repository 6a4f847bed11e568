"""Shakespeare by role (data/shakespeare.py) on a hand-written play, its checksum and
download paths, the IID control, the real tiny-shakespeare figures (when
FEDFORGE_DATA holds it), and the character LSTM (models/char_lstm.py)."""

from __future__ import annotations

import gzip
import hashlib
import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from fedforge.core.errors import DataError
from fedforge.data import shakespeare as sh
from fedforge.models.char_lstm import CharLSTM, char_lstm_parameters

A1 = "Now is the winter of our discontent"  # 35 characters
A2 = "Made glorious summer by this sun"  # 32
A3 = "And all the clouds that lour'd"  # 30
A4 = "In the deep bosom of the ocean buried."  # 38
A5 = "Now are our brows bound with victorious wreaths; our bruised arms hung up for monuments;"
B1 = "Grim-visaged war hath smooth'd his wrinkled front; and now, instead of mounting barbed steeds"
B2 = "To fright the souls of fearful adversaries,"
# ALPHA speaks two blocks; two blank lines before its second; GAMMA is too short.
PLAY = f"ALPHA:\n{A1}\n{A2}\n\nBETA:\n{B1}\n{B2}\n\n\nALPHA:\n{A3}\n{A4}\n{A5}\n\nGAMMA:\nHi.\n"


def chars(data: sh.ShakespeareData, indices: torch.Tensor) -> str:
    return "".join(data.vocab[int(i)] for i in indices)


def test_parse_roles_in_order_of_first_speech() -> None:
    roles = sh.parse_play(PLAY)
    assert list(roles) == ["ALPHA", "BETA", "GAMMA"]
    assert roles["ALPHA"] == [A1, A2, A3, A4, A5]  # both blocks, in order
    assert roles["BETA"] == [B1, B2] and roles["GAMMA"] == ["Hi."]
    # a speaker with no lines (a cue) is a role with none; a blank line of spaces ends a block
    assert sh.parse_play("A:\n\nB:\nx\n   \nA:\ny") == {"A": ["y"], "B": ["x"]}


def test_parse_rejects_a_block_without_speaker() -> None:
    with pytest.raises(DataError, match=r"line 4 .*'so it goes'"):
        sh.parse_play("A:\nx\n\nso it goes\n")


def test_a_text_without_roles_is_refused() -> None:
    with pytest.raises(DataError, match="no 'SPEAKER:' block"):
        sh.build_shakespeare("\n\n")


def test_split_is_in_order_with_the_last_fifth_rounded_up() -> None:
    # 5 lines: 4 train, 1 test; 2 lines: 1 and 1; 1 line: test only; 6 lines: 4 and 2
    assert sh.split_lines(["a", "b", "c", "d", "e"]) == ("a\nb\nc\nd\n", "e\n")
    assert sh.split_lines(["a", "b"]) == ("a\n", "b\n")
    assert sh.split_lines(["a"]) == ("", "a\n")
    assert sh.split_lines(list("abcdef")) == ("a\nb\nc\nd\n", "e\nf\n")
    assert sh.split_lines([]) == ("", "")


def _text(data: sh.ShakespeareData, row: torch.Tensor) -> str:
    """A label row as text, padding (-1) as '_'."""
    return "".join("_" if int(i) == sh.PAD else data.vocab[int(i)] for i in row)


def test_windows_labels_and_partition_of_the_play() -> None:
    data = sh.build_shakespeare(PLAY)
    assert data.roles == ("ALPHA", "BETA", "GAMMA")
    assert data.vocab == "".join(sorted(set(PLAY)))
    # newline, space, punctuation, capitals, lower case: index = position here
    assert data.vocab == "\n ',-.:;ABEGHILMNPTabcdefghiklmnoprstuvwy"
    alpha = f"{A1}\n{A2}\n{A3}\n{A4}\n"  # 139 chars: 138 labels, ceil(138 / 80) = 2 windows
    beta = f"{B1}\n"  # 94 chars: 93 labels, 2 windows
    assert len(alpha) == 139 and len(beta) == 94
    # train: ALPHA rows 0-1, BETA 2-3, GAMMA ("Hi." is its test line) none
    assert [list(p) for p in data.partition.client_indices] == [[0, 1], [2, 3], []]
    assert data.train_x.dtype == torch.int64 and tuple(data.train_x.shape) == (4, 80)
    assert tuple(data.train_y.shape) == (4, 80)
    # window 0 reads alpha[0:80] and at each step predicts the next character
    assert chars(data, data.train_x[0]) == alpha[:80]
    assert _text(data, data.train_y[0]) == alpha[1:81]
    # window 1 reads the rest (59 chars, then 21 of padding input) and predicts 58
    assert chars(data, data.train_x[1][:59]) == alpha[80:]
    assert _text(data, data.train_y[1]) == alpha[81:] + "_" * 22
    assert _text(data, data.train_y[2]) == beta[1:81]  # BETA's windows start in its own text
    assert _text(data, data.train_y[3]) == beta[81:] + "_" * 67
    # every character but a role text's first is a label once
    assert int((data.train_y != sh.PAD).sum()) == 138 + 93
    # test: ALPHA's A5 (89 chars: 2 windows), BETA's B2 (44: 1), GAMMA's "Hi." (4: 1)
    assert [list(p) for p in data.test_partition.client_indices] == [[0, 1], [2], [3]]
    assert _text(data, data.test_y[0]) == f"{A5}\n"[1:81]
    assert _text(data, data.test_y[3]) == "i.\n" + "_" * 77
    assert chars(data, data.test_x[3][:4]) == "Hi.\n"
    summary = sh.summarize_shakespeare(data)
    assert (summary.roles, summary.vocab, summary.train_windows, summary.test_windows) == (
        3,
        len(set(PLAY)),
        4,
        4,
    )
    assert (summary.train_chars, summary.test_chars) == (231, 88 + 43 + 3)
    assert (summary.min_train, summary.median_train, summary.max_train) == (0, 2.0, 2)
    assert summary.roles_without_train == 1 and "1 roles have no train window" in summary.format()


# ------------------------------------------------------------------ files and download


def _write_gz(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tinyshakespeare.txt.gz"
    path.write_bytes(gzip.compress(text.encode()))
    return path


def test_checksum_refuses_a_tampered_file(tmp_path: Path) -> None:
    path = _write_gz(tmp_path / "shakespeare", PLAY)
    got = hashlib.sha256(PLAY.encode()).hexdigest()
    with pytest.raises(DataError) as err:
        sh.load_shakespeare(tmp_path, download=False)
    msg = str(err.value)
    assert str(path) in msg and got in msg and sh.SHA256 in msg and "\n" not in msg


def test_a_checked_file_loads_gzip_or_plain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sh, "SHA256", hashlib.sha256(PLAY.encode()).hexdigest())
    _write_gz(tmp_path / "shakespeare", PLAY)
    assert sh.load_shakespeare(tmp_path, download=False).roles == ("ALPHA", "BETA", "GAMMA")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "tinyshakespeare.txt").write_text(PLAY)  # directly in data_dir
    monkeypatch.setenv("FEDFORGE_DATA", str(tmp_path / "plain"))
    assert len(sh.load_shakespeare(download=False).train_y) == 4


def test_missing_without_download_is_one_clean_line(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        sh.load_shakespeare(tmp_path / "nothing", download=False)
    msg = str(err.value)
    assert "download is disabled" in msg and "FEDFORGE_DATA" in msg and "\n" not in msg


def test_download_checks_the_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _write_gz(tmp_path / "web", PLAY)  # a gzip served as-is, stored plain
    with pytest.raises(DataError, match="content sha256 .* != expected"):
        sh.download_shakespeare(tmp_path / "dest", url=source.as_uri(), retries=2, backoff=0)
    assert not (tmp_path / "dest").exists() or not list((tmp_path / "dest").iterdir())
    monkeypatch.setattr(sh, "SHA256", hashlib.sha256(PLAY.encode()).hexdigest())
    monkeypatch.setattr(sh, "URL", source.as_uri())
    data = sh.load_shakespeare(tmp_path / "root")
    assert (tmp_path / "root" / "shakespeare" / "tinyshakespeare.txt").read_text() == PLAY
    assert data.roles == ("ALPHA", "BETA", "GAMMA")


# ----------------------------------------------------------------------- the real file


def _real_file() -> Path | None:
    root = os.environ.get("FEDFORGE_DATA")
    return sh._locate(Path(root)) if root else None


@pytest.mark.skipif(_real_file() is None, reason="FEDFORGE_DATA holds no tiny-shakespeare")
def test_real_tiny_shakespeare() -> None:
    start = time.perf_counter()
    data = sh.load_shakespeare(os.environ["FEDFORGE_DATA"], download=False)
    seconds = time.perf_counter() - start
    assert seconds < 5.0
    # 309 distinct 'SPEAKER:' names, case-sensitive ("All" and "ALL" are two roles)
    assert len(data.roles) == 309 and data.roles[:2] == ("First Citizen", "All")
    assert len(data.vocab) == 65 and data.vocab[13] == "A" and data.vocab[39] == "a"
    summary = sh.summarize_shakespeare(data)
    assert (summary.train_windows, summary.test_windows) == (10349, 2783)
    assert (summary.train_chars, summary.test_chars) == (817287, 209998)
    assert summary.roles_without_train == 41
    assert (summary.min_train, summary.median_train, summary.max_train) == (0, 9.0, 375)
    # independently: the speech is every line of a block after its first, each with its
    # newline; each role's train and test text (when not empty) loses its first character
    text = sh.read_text(_real_file())  # type: ignore[arg-type]
    blocks = [b.strip("\n").split("\n") for b in text.split("\n\n") if b.strip()]
    speech = sum(len(line) + 1 for b in blocks for line in b[1:] if line.strip())
    texts = sum(len(p) > 0 for p in data.partition.client_indices) + sum(
        len(p) > 0 for p in data.test_partition.client_indices
    )
    assert summary.train_chars + summary.test_chars == speech - texts
    first = data.partition.client_indices[0][0]
    assert chars(data, data.train_x[first]).startswith("Before we proceed any further")


# ------------------------------------------------------------------------------ model


def test_char_lstm_parameter_count() -> None:
    embedding = 65 * 8
    layer1 = 4 * 256 * (8 + 256) + 2 * 4 * 256
    layer2 = 4 * 256 * (256 + 256) + 2 * 4 * 256
    linear = 256 * 65 + 65
    expected = embedding + layer1 + layer2 + linear
    assert expected == 815945
    assert sum(p.numel() for p in CharLSTM(65).parameters()) == expected
    assert char_lstm_parameters(65) == expected


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_char_lstm_equals_unrolled_cells(dtype: torch.dtype, tol: float) -> None:
    torch.manual_seed(0)
    model = CharLSTM(65).to(dtype)
    cells = [nn.LSTMCell(8, 256), nn.LSTMCell(256, 256)]
    with torch.no_grad():
        for k, cell in enumerate(cells):
            cell.to(dtype)
            cell.weight_ih.copy_(getattr(model.lstm, f"weight_ih_l{k}"))
            cell.weight_hh.copy_(getattr(model.lstm, f"weight_hh_l{k}"))
            cell.bias_ih.copy_(getattr(model.lstm, f"bias_ih_l{k}"))
            cell.bias_hh.copy_(getattr(model.lstm, f"bias_hh_l{k}"))
        x = torch.randint(0, 65, (4, 20))
        states = [(torch.zeros(4, 256, dtype=dtype), torch.zeros(4, 256, dtype=dtype))] * 2
        steps = []
        for t in range(x.shape[1]):
            inp = model.embedding(x[:, t])
            for k, cell in enumerate(cells):
                states[k] = cell(inp, states[k])
                inp = states[k][0]
            steps.append(model.fc(inp))
        expected = torch.stack(steps, dim=1)  # the logits after each step
        got = model(x)
    assert got.shape == (4, 20, 65) and got.dtype == dtype
    assert torch.allclose(got, expected, rtol=0, atol=tol)
