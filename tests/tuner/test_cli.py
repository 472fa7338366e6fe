"""The tuner's commands are wired into `dlrm-platform`."""

from __future__ import annotations

from dlrm_platform.cli import build_parser


def test_analyze_and_tuner_train_are_registered():
    parser = build_parser()
    args = parser.parse_args(["analyze", "configs/demo.yaml", "--json", "--seconds", "5"])
    assert args.json and args.seconds == 5.0 and callable(args.handler)
    args = parser.parse_args(["tuner", "train", "--out", "/tmp/x", "--iterations", "2"])
    assert args.iterations == 2 and args.out == "/tmp/x" and callable(args.handler)


def test_analyze_missing_file_is_a_user_error(capsys):
    from dlrm_platform.cli import main

    assert main(["analyze", "does/not/exist.yaml"]) == 2
    assert "no such file" in capsys.readouterr().err
