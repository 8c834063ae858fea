"""Config loading: every key and type is checked, and errors name the dotted key."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from tirl.commands.run_config import TirlConfig
from tirl.core.config import (
    ConfigError,
    apply_overrides,
    from_dict,
    load_config,
    save_config,
    to_dict,
    with_sections,
)


@dataclass
class OptimConfig:
    lr: float = 1e-6
    betas: tuple[float, ...] = (0.9, 0.999)
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


@dataclass
class RLConfig:
    algo: Literal["grpo", "dapo"] = "grpo"
    group_size: int = 8
    clip_eps: float = 0.2
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class TrainConfig:
    name: str = "run"
    seed: int = 0
    bf16: bool = True
    tags: list[str] = field(default_factory=list)
    max_steps: int | None = None
    rl: RLConfig = field(default_factory=RLConfig)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_nested_load_from_yaml(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name: exp1\nseed: 3\ntags: [a, b]\n"
        "rl:\n  algo: dapo\n  optim:\n    lr: 2.0e-5\n    betas: [0.8, 0.9]\n",
    )
    cfg = load_config(TrainConfig, path)
    assert cfg == TrainConfig(
        name="exp1",
        seed=3,
        tags=["a", "b"],
        rl=RLConfig(algo="dapo", optim=OptimConfig(lr=2e-5, betas=(0.8, 0.9))),
    )
    assert isinstance(cfg.rl.optim.betas, tuple)


def test_missing_keys_take_defaults() -> None:
    assert load_config(TrainConfig) == TrainConfig()
    assert from_dict(TrainConfig, {"rl": {}}) == TrainConfig()


def test_overrides_of_each_kind(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 1\n")
    cfg = load_config(
        TrainConfig,
        path,
        [
            "seed=7",
            "rl.clip_eps=0.28",
            "bf16=false",
            "name=my-run",
            "tags=[x, y]",
            "rl.optim.warmup_steps=10",
            "max_steps=null",
        ],
    )
    assert cfg.seed == 7
    assert cfg.rl.clip_eps == 0.28
    assert cfg.bf16 is False
    assert cfg.name == "my-run"
    assert cfg.tags == ["x", "y"]
    assert cfg.rl.optim.warmup_steps == 10
    assert cfg.max_steps is None


def test_override_exponent_float_without_dot() -> None:
    # YAML 1.1 reads `1e-3` as a string; a float field must still get the number.
    cfg = load_config(TrainConfig, None, ["rl.optim.lr=1e-3"])
    assert cfg.rl.optim.lr == 0.001
    assert type(cfg.rl.optim.lr) is float
    assert apply_overrides({}, ["rl.clip_eps=2e-1"], TrainConfig) == {"rl": {"clip_eps": 0.2}}


def test_exponent_float_in_yaml_file(tmp_path: Path) -> None:
    cfg = load_config(TrainConfig, write(tmp_path, "rl:\n  optim:\n    lr: 1e-3\n"))
    assert cfg.rl.optim.lr == 0.001


def test_numeric_override_for_string_field_keeps_the_text() -> None:
    assert load_config(TrainConfig, None, ["name=2024"]).name == "2024"


def test_override_does_not_mutate_input() -> None:
    data = {"rl": {"group_size": 4}}
    out = apply_overrides(data, ["rl.group_size=16"], TrainConfig)
    assert data == {"rl": {"group_size": 4}}
    assert out == {"rl": {"group_size": 16}}


def test_unknown_top_level_key_names_it_and_lists_valid_keys() -> None:
    with pytest.raises(ConfigError, match="'sed'") as exc:
        from_dict(TrainConfig, {"sed": 1})
    assert "name, seed, bf16, tags, max_steps, rl" in str(exc.value)


def test_unknown_nested_key_names_dotted_path() -> None:
    with pytest.raises(ConfigError, match=r"'rl\.optim\.lrr'") as exc:
        from_dict(TrainConfig, {"rl": {"optim": {"lrr": 1.0}}})
    assert "lr, betas, warmup_steps" in str(exc.value)


def test_unknown_override_key_names_dotted_path() -> None:
    with pytest.raises(ConfigError, match=r"'rl\.lrr'") as exc:
        apply_overrides({}, ["rl.lrr=1e-3"], TrainConfig)
    assert "algo, group_size, clip_eps, optim" in str(exc.value)
    with pytest.raises(ConfigError, match="'sed'"):
        load_config(TrainConfig, None, ["sed=1"])


def test_override_into_a_leaf_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"'seed' \(int\) is not a section"):
        apply_overrides({}, ["seed.x=1"], TrainConfig)


def test_wrong_type_message_names_key_type_and_value() -> None:
    with pytest.raises(ConfigError) as exc:
        from_dict(TrainConfig, {"rl": {"group_size": "eight"}})
    msg = str(exc.value)
    assert "rl.group_size" in msg and "int" in msg and "'eight'" in msg


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),  # bool is an int subclass; it must not pass as one
        ({"bf16": 1}, "bf16"),
        ({"name": 3}, "name"),
        ({"tags": "a"}, "tags"),
        ({"tags": [1]}, r"tags\[0\]"),
        ({"rl": {"clip_eps": "abc"}}, r"rl\.clip_eps"),
        ({"rl": {"optim": {"betas": 0.9}}}, r"rl\.optim\.betas"),
        ({"rl": 3}, "rl"),
    ],
)
def test_wrong_types_are_rejected(data: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        from_dict(TrainConfig, data)


def test_int_accepted_for_float() -> None:
    cfg = from_dict(TrainConfig, {"rl": {"clip_eps": 1}})
    assert cfg.rl.clip_eps == 1.0 and type(cfg.rl.clip_eps) is float


def test_literal_validation() -> None:
    with pytest.raises(ConfigError, match=r"rl\.algo.*one of \['grpo', 'dapo'\].*'ppo'"):
        load_config(TrainConfig, None, ["rl.algo=ppo"])


def test_post_init_error_gets_the_section_path() -> None:
    with pytest.raises(ConfigError, match=r"^rl\.optim: lr must be > 0, got -1\.0$"):
        from_dict(TrainConfig, {"rl": {"optim": {"lr": -1.0}}})


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(TrainConfig, missing)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cfg.yaml.*mapping"):
        load_config(TrainConfig, write(tmp_path, "- 1\n- 2\n"))


def test_override_without_equals() -> None:
    with pytest.raises(ConfigError, match="'seed' must have the form dotted.key=value"):
        load_config(TrainConfig, None, ["seed"])


def test_save_load_round_trip(tmp_path: Path) -> None:
    cfg = TrainConfig(
        name="x",
        seed=5,
        bf16=False,
        tags=["t"],
        max_steps=100,
        rl=RLConfig(algo="dapo", clip_eps=0.28, optim=OptimConfig(lr=1e-5, betas=(0.9, 0.95))),
    )
    path = save_config(cfg, tmp_path / "out" / "config.yaml")
    assert load_config(TrainConfig, path) == cfg
    assert to_dict(cfg)["rl"]["optim"]["betas"] == [0.9, 0.95]
    assert list(to_dict(cfg)) == ["name", "seed", "bf16", "tags", "max_steps", "rl"]
    assert path.read_text().startswith("name: x\n")


@pytest.mark.parametrize(
    "override, said",
    [
        ("rl.loss.clip_low=.nan", "clip_low=nan must be a finite number with 0 <= clip_low < 1"),
        ("rl.loss.clip_low=1.5", "clip_low=1.5 must be a finite number with 0 <= clip_low < 1"),
        ("rl.loss.clip_high=.inf", "clip_high=inf must be a finite number"),
        ("rl.loss.clip_c=1.0", "clip_c=1.0 must be a finite number with 1 < clip_c"),
        ("rl.kl.coef=-0.1", "rl.kl.coef=-0.1 must be a finite number with 0 <= rl.kl.coef"),
        ("rl.entropy_coef=.nan", "entropy_coef=nan must be a finite number"),
        (
            "rl.correction.mis_high=.nan",
            "mis_high=nan must be a finite number with rl.correction.mis_low (0.0) < rl",
        ),
        (
            "rl.correction.mis_low=4.0",
            "mis_high=3.0 must be a finite number with rl.correction.mis_low (4.0) < rl",
        ),
        ("rl.optim.lr=.nan", "lr=nan must be a finite number with 0 < lr"),
        ("sft.optim.beta2=1.0", "beta2=1.0 must be a finite number with 0 <= beta2 < 1"),
        ("sft.optim.weight_decay=-1", "weight_decay=-1"),
        ("sft.optim.eps=0", "eps=0"),
        ("rl.optim.grad_clip=.nan", "grad_clip=nan"),
    ],
)
def test_out_of_range_floats_are_refused_when_the_config_loads(override, said):
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_config(TirlConfig, None, [override])


def test_recipe_configs_cite_the_paper_and_its_repository_not_a_file_outside_the_project():
    recipes = sorted((Path(__file__).parents[1] / "src" / "tirl" / "configs").glob("recipe-*.yaml"))
    assert len(recipes) == 4
    for f in recipes:
        text = f.read_text()
        assert "../shared" not in text, f
        assert "arXiv 2510.11701" in text and "github.com/Gen-Verse/Open-AgentRL recipe/demystify" in text, f


@pytest.mark.parametrize("override", ["rl.data=[a,b", "rl.data={a: [1", 'rl.steps="3'])
def test_an_override_that_is_not_yaml_is_one_line_naming_it(override, capsys):
    from tirl.cli import main

    with pytest.raises(ConfigError, match=re.escape(f"override {override!r}: the value is not valid YAML")):
        load_config(TirlConfig, None, [override])
    assert main(["plan", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and override in err and "Traceback" not in err
    assert (
        load_config(TirlConfig, None, ['rl.data="[a,b"']).rl.data == "[a,b"
    )  # the quoting the error suggests


def test_negative_threads_are_refused_when_the_config_loads():
    with pytest.raises(ConfigError, match=re.escape("threads must be >= 0 (0 = all cores), got -1")):
        load_config(TirlConfig, None, ["threads=-1"])
    assert load_config(TirlConfig, None, ["threads=2"]).threads == 2


def test_task_options_follow_task_name_in_any_override_order(tmp_path):
    """`task.*` is the named task's own dataclass; the name may come after its keys; another task's key is refused."""
    from tirl.tasks.arith.task import ArithOptions
    from tirl.tasks.gsm8k import GSM8KOptions

    cfg = load_config(TirlConfig, None, ["task.num_sft=5", "task.name=gsm8k"])
    assert isinstance(cfg.task, GSM8KOptions) and cfg.task.num_sft == 5
    assert isinstance(TirlConfig().task, ArithOptions)  # the default task's options
    saved = save_config(cfg, tmp_path / "c.yaml")
    assert load_config(TirlConfig, saved) == cfg
    with pytest.raises(ConfigError, match=r"'task.style'.*\(GSM8KOptions\): name, num_sft"):
        load_config(TirlConfig, None, ["task.name=gsm8k", "task.style=word"])
    for old, new in (
        ("warmup.epochs=1", "demo.warmup"),
        ("tiny.num_layers=1", "demo.tiny"),
        ("task.warmup.epochs=1", "demo.warmup"),
        ("task.tiny.num_layers=1", "demo.tiny"),
    ):
        with pytest.raises(ConfigError, match=f"is now '{new}'"):
            load_config(TirlConfig, None, [old])
    with pytest.raises(ConfigError, match="unknown task '\\['"):
        load_config(TirlConfig, None, ["task.name=[", "task.num_sft=3"])


def test_a_config_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(
        ConfigError, match=re.escape(f"config file {path} is not UTF-8 text (byte 0xe9 at offset 9)")
    ):
        load_config(TrainConfig, path)


def _billion_laughs() -> list[str]:
    """The classic: nine levels of nine aliases each, 9**9 strings once expanded, from ~400 bytes."""
    items = [f"&a [{', '.join(['lol'] * 9)}]"]
    items += [f"&{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)]
    return items


# the load runs in a child capped at 1 GiB of address space, with 60 s allowed (~0.1 s measured): without the alias
# bound, the error message alone expanded this to 2.2 GB in 36 s
_BOMB_CHILD = """
import resource, sys
from dataclasses import dataclass
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from tirl.core.config import ConfigError, load_config

@dataclass
class C:
    seed: int = 0

try:
    load_config(C, sys.argv[1] or None, sys.argv[2:])
except ConfigError as e:
    print(e)
"""


@pytest.mark.parametrize("where", ["file", "override"])
def test_a_billion_laughs_config_is_refused_in_bounded_time_and_memory(tmp_path: Path, where: str) -> None:
    import os
    import subprocess
    import sys

    items = _billion_laughs()
    if where == "file":
        argv = [str(write(tmp_path, "seed:\n" + "".join(f"  - {i}\n" for i in items)))]
    else:
        argv = ["", f"seed=[{', '.join(items)}]"]
    src = Path(__file__).resolve().parents[1] / "src"
    done = subprocess.run(
        [sys.executable, "-c", _BOMB_CHILD, *argv], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(src)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "its aliases expand to more than 100000 values" in done.stdout
    assert len(done.stdout) < 1000


def test_an_alias_that_contains_itself_is_refused(tmp_path: Path) -> None:
    @dataclass
    class Loose:
        extra: object = None

    said = "cfg.yaml: the value &a at line 1 contains its own alias *a (it would expand without end)"
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_config(Loose, write(tmp_path, "extra: &a [1, *a]\n"))


def test_a_huge_value_is_shortened_in_the_error_message() -> None:
    with pytest.raises(ConfigError) as exc:
        from_dict(TrainConfig, {"seed": ["x" * 10_000] * 100})
    msg = str(exc.value)
    assert msg.startswith("config key 'seed' expects int, got ['xxx") and msg.endswith("(list)")
    assert len(msg) < 500


@dataclass
class ServerSection:
    port: int = 0


@dataclass
@with_sections({"server": ServerSection, "optim": OptimConfig})  # as a registry would hand them over
class SectionedConfig:
    name: str = "run"


def test_contributed_sections_are_fields_after_the_declared_ones(tmp_path: Path):
    cfg = load_config(SectionedConfig, None, ["server.port=8000", "optim.lr=0.5"])
    assert [f.name for f in dataclasses.fields(SectionedConfig)] == ["name", "server", "optim"]
    assert cfg == SectionedConfig(server=ServerSection(port=8000), optim=OptimConfig(lr=0.5))
    assert SectionedConfig().server is not SectionedConfig().server  # each instance its own default
    assert load_config(SectionedConfig, save_config(cfg, tmp_path / "c.yaml")) == cfg
    with pytest.raises(
        ConfigError, match=r"^unknown config key 'server\.host' in override .*; valid keys at 'server': port$"
    ):
        load_config(SectionedConfig, None, ["server.host=x"])


def test_a_contributed_section_cannot_take_a_declared_name():
    @dataclass
    class Named:
        name: str = "run"

    with pytest.raises(TypeError, match="Named already has 'name': a section cannot take its name"):
        with_sections({"name": ServerSection})(Named)


def test_an_old_demo_config_with_the_tiny_model_under_task_migrates_to_demo(tmp_path):
    """`task.tiny` and `task.warmup` (older demo configs and run directories) move to `demo.*`; the migrated file
    loads as the packaged demo config does."""
    import yaml

    import tirl
    from tirl.commands.config import migrate_file

    packaged = Path(tirl.__file__).parent / "configs" / "demo.yaml"
    data = yaml.safe_load(packaged.read_text())
    demo = data.pop("demo")
    data["task"].update(demo)
    old = tmp_path / "config.yaml"
    old.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="config key 'task.tiny' is now 'demo.tiny'"):
        load_config(TirlConfig, old)
    notes = migrate_file(old)
    assert sorted(notes) == ["task.tiny -> demo.tiny", "task.warmup -> demo.warmup"]
    assert load_config(TirlConfig, old) == load_config(TirlConfig, packaged)


def test_a_task_override_over_a_file_whose_task_section_names_no_task_starts_from_that_tasks_defaults():
    """configs/demo.yaml sets arith's options without `task.name` (arith is the default): `task=gsm8k` over it
    (task.name=gsm8k) switches the variant, so arith's options are dropped rather than refused as unknown keys of GSM8K's."""
    from tirl.core.config import read_config_file
    from tirl.demo.command import DEMO_CONFIG

    assert (
        "name" not in read_config_file(DEMO_CONFIG)["task"]
        and "num_sft" in read_config_file(DEMO_CONFIG)["task"]
    )
    cfg = load_config(TirlConfig, DEMO_CONFIG, ["task.name=gsm8k"])
    assert cfg.task.name == "gsm8k" and cfg.task == type(cfg.task)(
        name="gsm8k"
    )  # GSM8K's defaults, not arith's
    assert (
        load_config(TirlConfig, DEMO_CONFIG, ["task.name=arith"]).task.num_sft
        == read_config_file(DEMO_CONFIG)["task"]["num_sft"]
    )
