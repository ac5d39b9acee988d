"""`dinops <command> [options]`: a thin dispatcher.

Each command lives in its own module and parses its own arguments, so that `dinops client` never imports
torch and `dinops <command> --help` is the command's manual. The table maps a command to
``module:function``; the function takes the remaining argv and returns an exit status.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "synth": ("dinops.data.synth:main", "write a deterministic synthetic COCO-format dataset"),
    "train": ("dinops.train.main:main", "train DINO (single process or under torchrun)"),
    "data-ready": ("dinops.train.progress:data_ready", "wait until the dataset's download completion marker is there"),
    "cache": ("dinops.train.cache_command:main", "fill the local decoded-image cache of the train and val splits"),
    "eval": ("dinops.train.evaluate:main", "COCO bbox evaluation of a checkpoint"),
    "analyze": ("dinops.train.analyze:main", "plots and a summary from a training output directory"),
    "hpo": ("dinops.train.hpo:main", "`hpo report`: table and plots of a finished Katib hyperparameter search"),
    "serve": ("dinops.serve.cli:main", "run the inference API"),
    "client": ("dinops.client.cli:main", "run the web client"),
    "download": ("dinops.download.cli:main", "download COCO or any URL list, resumable and verified"),
    "gpu-check": ("dinops.gpu_check:main", "prove that this container sees a GPU and can compute on it"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: dinops <command> [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "Run `dinops <command> --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from dinops import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"dinops: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    target, _ = COMMANDS[name]
    module_name, func_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        print(
            f"dinops {name}: this installation lacks what the command needs ({exc.name}); "
            f"install the matching extra, e.g. pip install 'dinops[{_extra_for(name)}]'",
            file=sys.stderr,
        )
        return 2
    return int(getattr(module, func_name)(rest) or 0)


def _extra_for(command: str) -> str:
    return {"serve": "serve", "client": "client", "download": "download", "gpu-check": "model"}.get(command, "train")


if __name__ == "__main__":
    sys.exit(main())
