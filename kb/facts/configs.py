"""Config parsing: YAML / JSON (DeepSpeed) blocks, `key=value` lines, Python calls (`SomeConfig(...)`,
`from_pretrained(torch_dtype=...)`, `model.half()`) and command lines of each framework -> canonical facts."""

from __future__ import annotations

import ast
import json
import math
import re
import shlex
from collections.abc import Mapping
from typing import Any

from kb.canonical import (
    GPU_NAME,
    PRECISION_FLAGS,
    canonical,
    canonical_algorithm,
    canonical_key,
    parse_bool,
    said_as_fix,
    spec,
)
from kb.facts.boundary import too_deep
from kb.facts.model import Facts

# Linear: the value is everything after the separator; trailing spaces and a comma are stripped in Python (a lazy
# `.*?` followed by `\s*,?\s*$` backtracked cubically on a line of spaces).
# `deepspeed==0.10.3` is a pinned package, not `deepspeed = "=0.10.3"`.
_KV_LINE = re.compile(r"^[ \t]*(?:-[ \t]+)?[\"']?(?P<k>[A-Za-z_][\w.\-/]*)[\"']?[ \t]*(?P<sep>:|=(?!=))(?P<v>.*)$")
_BLOCK_OPEN = re.compile(r"^[ \t]*(?:-[ \t]+)?[\"']?(?P<k>[A-Za-z_][\w.\-/]*)[\"']?[ \t]*[:=][ \t]*"
                         r"(?:(?:\{|dict\()[ \t]*)?(?:#.*)?$")
_INLINE_KV = re.compile(r"(?<![\w.\-])(?P<k>[A-Za-z_][\w.]*)\s*(?<![=!<>])=(?!=)\s*"
                        r"(?P<v>\"[^\"]*\"|'[^']*'|torch\.\w+|\$\{[A-Za-z_]\w*:-[^{}$\s]{1,80}\}|[^\s,()\[\]{}，）（；。、]+)")
_ADD_ARGUMENT = re.compile(r"add_argument\(\s*['\"]--?(?P<k>[A-Za-z][\w.\-]*)['\"](?:[^)\n]*?\bdefault\s*=\s*"
                           r"(?P<v>\"[^\"\n]*\"|'[^'\n]*'|[^,)\s]+))?")
_FLAG = re.compile(r"(?<![\w\-])--(?P<k>[A-Za-z][\w.\-]*)(?:[ =](?P<v>(?!--)(?:[^\s\\]|\\(?=\S))+))?")  # (`F:\data\m`)
_PROSE_KV = re.compile(r"(?<![\w\-{])(?P<k>[A-Za-z]+_[A-Za-z_]+)\s*(?:设置为|设为|为|is|of|set to|[:=])?\s*"
                       r"(?P<v>[A-Za-z0-9][\w.\-]*)")
_HALF_CALL = re.compile(r"\b(?P<obj>\w*model\w*)\s*(?:=\s*\w+)?\.(?:half\(\)|to\(\s*(?:dtype\s*=\s*)?torch\.(?:float16|half)\s*\))",
                        re.IGNORECASE)
_FROM_PRETRAINED = re.compile(r"from_pretrained\(\s*(?:pretrained_model_name_or_path\s*=\s*)?(?:[\"'](?P<m>[^\"']+)[\"'])?")
_QUOTED_ARG = re.compile(r"^\s*[\"'](?P<m>[^\"']+)[\"']\s*,?\s*(?:#.*)?$")
_AUTOCAST = re.compile(r"autocast\([^)]*dtype\s*=\s*torch\.(?P<d>float16|half|bfloat16)|GradScaler\(|"
                       r"(?:autocast|AMP) (?:with|and|\+) (?:a )?GradScaler\b", re.IGNORECASE)
_LAUNCHERS = ("swift", "deepspeed", "torchrun", "accelerate", "python", "python3", "llamafactory-cli", "xtuner",
              "trl", "bash", "sh", "srun", "ray", "openrlhf", "colossalai", "tune", "axolotl")
# ms-swift's Megatron-SWIFT installs a `megatron` command: `megatron sft --model Qwen/Qwen3-8B ...`
_SWIFT_MEGATRON = re.compile(r"megatron (?:sft|pt|rlhf|export)\b", re.IGNORECASE)
_COMMENTED_COMMAND = re.compile(r"^[ \t]*#+[ \t]*(?:[A-Z_][A-Z0-9_]*=\S*[ \t]+){0,4}(?:torchrun|deepspeed|accelerate|python3?|"
                                r"swift|llamafactory-cli|srun|bash|sh)[ \t]+\S")
_RUN_PREFIX = re.compile(r"^[ \t]*(?:运行|执行|启动命令|命令|I (?:run|ran|use|used)|running|run)[ \t]*[:：]?[ \t]*(?=\S+[ \t])",
                         re.IGNORECASE)
_ENV_ASSIGN = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")
_WRAPPERS = {"nohup": 1, "exec": 1, "time": 1, "poetry": 2, "uv": 2, "pipenv": 2}  # `poetry run python -m ...`


def _unwrap(toks: list[str], i: int = 0) -> int:
    """The index of the launcher after `nohup` / `poetry run` / `uv run` prefixes."""
    while i < len(toks) and toks[i].lower() in _WRAPPERS:
        skip = _WRAPPERS[toks[i].lower()]
        if skip == 2 and (i + 1 >= len(toks) or toks[i + 1].lower() != "run"):
            break
        i += skip
    return i


# A launcher script's own variables: `MODEL_PATH=/nas/qwen2.5-7b-it` or `export LR=4e-7` on a line of its own, used
# later as `--model $MODEL_PATH` / `optim.lr=${LR}`.
_SHELL_ASSIGN = re.compile(r"^[ \t]*(?:export[ \t]+)?(?P<k>[A-Za-z_]\w*)=(?P<v>\"[^\"$`]*\"|'[^']*'|[^\s$`;&|]+|"
                           r"\$\(\([ \t\d*]{1,40}\)\)|\$\{[A-Za-z_]\w*:-[^}\s$]{1,40}\})[ \t]*(?:&&.*|#.*)?$")
# Shell arithmetic of verl's example scripts: `max_response_length=$((1024 * 8))` (products of numbers only), and
# a variable's default, `${PER_DEVICE_BATCH_SIZE:-1}`.
_SHELL_ARITH = re.compile(r"\$\(\([ \t]{0,3}(\d{1,7}(?:[ \t]{0,3}\*[ \t]{0,3}\d{1,7}){0,3})[ \t]{0,3}\)\)")
_SHELL_DEFAULT = re.compile(r"\$\{[A-Za-z_]\w*:-([^}\s$]{1,40})\}")
# `--deepspeed $cur_path/ds_config_zero3.json`: an unknown folder in front of a file
_UNKNOWN_DIR = re.compile(r"^\$(?:\{[A-Za-z_]\w*\}|[A-Za-z_]\w*)/(?=[^\s$]*[A-Za-z])")


def _arith(v: str) -> str:
    """`$((1024 * 8))` -> "8192", `${PER_DEVICE_BATCH_SIZE:-1}` -> "1" (its default); anything else unchanged."""
    if "$" not in v:
        return v
    m = _SHELL_ARITH.fullmatch(v.strip())
    if m:
        return str(math.prod(int(x) for x in m.group(1).split("*")))
    m = _SHELL_DEFAULT.fullmatch(v.strip())
    return m.group(1) if m else v


# Which devices a launcher sees: NVIDIA, Ascend NPUs, AMD ROCm.
_VISIBLE_DEVICES = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
_SHELL_REF = re.compile(r"\$(?:\{(?P<b>[A-Za-z_]\w*)(?::-(?P<d>[^}\s]{0,40}))?\}|(?P<p>[A-Za-z_]\w*))")


_COMMENTED = re.compile(r"^[ \t]*#[ \t]*(?:--(?P<f>[A-Za-z][\w.\-]*)|(?P<k>[A-Za-z_][\w.\-]*)[ \t]*[:=][ \t]*\S)")


def commented_setting(s: str) -> bool:
    """`# flash_attn: fa2`, `#   --deepspeed ds_z3.json`: a setting commented out in a pasted config or script."""
    m = _COMMENTED.match(s) if "#" in s else None
    if m is None:
        return "#" in s and _COMMENTED_COMMAND.match(s) is not None  # `# torchrun --nproc_per_node=3`: never run
    key = m.group("f") or m.group("k")
    return canonical_key(key) is not None or key.lower() in PRECISION_FLAGS


def shell_variables(lines: list[tuple[int, str]]) -> dict[str, tuple[str, int, str]]:
    """The paste's own `NAME=value` assignments (the last one wins) -> (value, line, text): `$NAME` in its commands
    reads them, and `export CUDA_VISIBLE_DEVICES=...` before the launcher says how many devices it sees."""
    out: dict[str, tuple[str, int, str]] = {}
    for n, s in lines:
        if "=" in s and len(s) < 500:
            m = _SHELL_ASSIGN.match(s)
            if m:
                out[m.group("k")] = (_arith(m.group("v").strip("'\"")), n, s.strip())
    return out


def _launch_devices(env: Mapping[str, str], facts: Facts, n: int, detail: str, source: str) -> None:
    """NPROC_PER_NODE, else the devices a launcher is shown (`CUDA_VISIBLE_DEVICES=0,1`, Ascend's and ROCm's)."""
    if env.get("NPROC_PER_NODE"):
        _set_config(facts, "nproc_per_node", env["NPROC_PER_NODE"], n, detail, source)
        return
    visible = next((env[v] for v in _VISIBLE_DEVICES if env.get(v)), None)
    if visible and re.fullmatch(r"\d+(?:,\d+)*", visible):
        facts.set("num_gpus", len(visible.split(",")), "config", n, detail, source)


def _expand(v: str, shell: dict[str, tuple[str, int, str]]) -> str:
    """`$NAME` / `${NAME}` replaced by the paste's own value; one that stays unknown is left for _set_config to drop."""
    def value(m: re.Match[str]) -> str:
        got = shell.get(m.group("b") or m.group("p"))
        if got and got[0] and not _SHELL_REF.fullmatch(got[0]):
            return got[0]
        return m.group("d") if m.group("d") else m.group(0)  # `${PER_DEVICE_BATCH_SIZE:-1}`: its default

    return _SHELL_REF.sub(value, v) if "$" in v else v


# A flag whose value is a plugin file (`--external_plugins custom_reward.py`), not the script that trains.
_PLUGIN_FLAG = re.compile(r"--\w*(?:plugin|register|reward_f|custom)", re.IGNORECASE)
_SCRIPT_ALGO = re.compile(r"(?:^|[/_\-])(sft|dpo|kto|orpo|simpo|cpo|ipo|ppo|grpo|rm|reward_modeling|reward|pretrain|"
                          r"pretraining|pt)(?:[_\-.]|$)", re.IGNORECASE)
_DS_STAGE = re.compile(r"(?:zero|z|stage)[_\-]?([0-3])(?!\d)", re.IGNORECASE)


def _is_bool(raw_key: str) -> bool:
    k = canonical_key(raw_key)
    sp = spec(k) if k else None
    return (sp is not None and sp.kind == "bool") or raw_key.lower().strip("-") in PRECISION_FLAGS


def _set_flag(facts: Facts, raw_key: str, value: str, n: int, detail: str, source: str, fix: bool = False) -> None:
    """`--key value` on a command line. A switch followed by something that is not a value is on, the word after
    it a positional (`--vanilla_loss x.py`); `--fp16 false` is the switch set off, which says nothing."""
    if raw_key.strip("-").lower() in ("config_file", "config") and value != "true":
        base = value.rsplit("/", 1)[-1].lower()  # accelerate's `--config_file .../deepspeed_zero3.yaml`
        m = _DS_STAGE.search(base) if ("deepspeed" in base or "zero" in base or base.startswith("ds")) else None
        if m:
            facts.set("zero_stage", int(m.group(1)), "config", n, detail, source)
    if _set_config(facts, raw_key, value, n, detail, source, fix=fix) is None and value != "true" \
            and _is_bool(raw_key) and parse_bool(value) is None:
        _set_config(facts, raw_key, "true", n, detail, source)


def strip_comment(v: str) -> str:
    """`value  # comment` -> `value`, found without a regex (`\\s+#.*$` was quadratic on a run of spaces)."""
    i = v.find("#")
    while i > 0:
        if v[i - 1] in " \t":
            return v[:i].rstrip()
        i = v.find("#", i + 1)
    return v


def _clean_value(v: str) -> str:
    v = strip_comment(v).strip().rstrip(",").strip()
    return v.strip("'\"")


_NEXT_SETTING = re.compile(r"(?<=\s)[+~]?[A-Za-z_][\w.\-]*[ \t]*[=:]")
_CALL_VALUE = re.compile(r"^[A-Za-z_][\w.]*\(")
_PRODUCT = re.compile(r"^(\d{1,6})\s*(?:\*\s*(\d{1,6})|[*/+\-]\s*[\w.(])\s*(?:#.*)?$")


def _line_value(v: str, sep: str) -> str | None:
    """The value of `key = value` / `key: value` on one line, ending where the value ends.

    A quoted value ends at its closing quote (`attn_implementation="flash_attention_2" google/...`); an unquoted
    `=` value ends at whitespace, a comma or a paren, so space-separated hydra overrides
    (`a.b=1 c.d=low_var_kl`) are each read by `inline`; a trailing `\\` continuation is dropped.
    None for a Python call (`model = AutoModel.from_pretrained(`), which is not a setting.
    """
    v = re.sub(r"\s*\\$", "", v.strip())
    v = _arith(v) if "$((" in v else v
    if v.startswith(("${", "\"${")) and ":-" in v:  # `NNODES=${NNODES:-16}`: the script's default (what runs unless
        v = _expand(v, {})                             # the caller overrides it)
    if not v:
        return ""
    if v[0] in "'\"":
        end = v.find(v[0], 1)
        return v[1:end] if end > 0 else _clean_value(v)
    if _CALL_VALUE.match(v):
        return None
    m = _PRODUCT.match(v)
    if m:  # `accumulative_counts = 32*4`: the product; any other arithmetic is not read
        return str(int(m.group(1)) * int(m.group(2))) if m.group(2) else None
    if sep == "=" or _NEXT_SETTING.search(v):
        return re.split(r"[\s,()]", v, maxsplit=1)[0]
    return _clean_value(v)


# A bare batch size: per device in a Trainer, but the global batch where the same paste also sets a micro-batch
# (alpaca-lora's and nanoGPT-style `--batch_size 128 --micro_batch_size 4`, OpenRLHF's train_batch_size aside).
_LOOSE_BATCH = re.compile(r"-{0,2}batch[_-]size", re.IGNORECASE)


def _set_config(facts: Facts, raw_key: str, raw_value: Any, n: int, detail: str, source: str, kind: str = "config",
                fix: bool = False) -> str | None:
    if isinstance(raw_value, str) and "$" in raw_value:
        raw_value = _UNKNOWN_DIR.sub("", raw_value)  # the file under an unknown folder is still the file
    if isinstance(raw_value, str) and _SHELL_REF.search(raw_value):
        return None  # `--model $MODEL_PATH` with no MODEL_PATH= in the paste: a name, not the setting's value
    got = canonical(raw_key, raw_value)
    if got is None:
        return None
    key, value = got
    if key == "model" and raw_key.lower().lstrip("-").replace("-", "_").endswith("model_type") \
            and re.fullmatch(r"[A-Za-z]+", str(value)):
        return None  # MedicalGPT's `--model_type llama`: an architecture, not the model (ms-swift's names one)
    if fix:
        facts.add("fix_changes", f"{key}={value}", "text", n, detail, source)
        if key in ("precision", "weights_dtype") and value in ("bf16", "fp32"):
            facts.set("working_dtype", value, "text", n, detail, source)
        return key
    loose = key == "micro_batch_size" and _LOOSE_BATCH.fullmatch(raw_key.strip()) is not None
    old = facts.get(key)
    if key == "precision" and value in ("fp8", "fp4") and old is not None and old.value == "bf16" and old.kind == kind:
        facts.items.pop(key)  # `--bf16 --fp8-format hybrid`: FP8 GEMMs beside bf16 weights; the run is FP8
    if old is not None and key in facts.loose and not loose and old.kind == kind:
        facts.items.pop(key)  # `--batch_size 128 --micro_batch_size 4` (alpaca-lora): the per-device one is 4
        facts.loose.discard(key)
    if loose and old is None:
        facts.loose.add(key)
    facts.set(key, value, kind, n, detail, source)
    if key == "deepspeed_config":
        m = _DS_STAGE.search(str(value).rsplit("/", 1)[-1])
        if m:
            facts.set("zero_stage", int(m.group(1)), kind, n, detail, source)
    if key == "loss_type" and str(value).lower() in ("simpo",):
        facts.set("algorithm", "SimPO", kind, n, detail, source)
    return key


def flatten(obj: Any, prefix: str = "", keep_lists: bool = False) -> list[tuple[str, Any]]:
    """Nested mappings -> (dotted.path, leaf) pairs; lists are leaves when `keep_lists`, else dropped."""
    out: list[tuple[str, Any]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += flatten(v, f"{prefix}.{k}" if prefix else str(k), keep_lists)
    elif keep_lists or not isinstance(obj, list):
        out.append((prefix, obj))
    return out


def _line_of(lines: list[tuple[int, str]], key: str, default: int) -> int:
    last = key.rsplit(".", 1)[-1]
    for n, s in lines:
        if re.search(r"[\"']?" + re.escape(last) + r"[\"']?\s*[:=]", s):
            return n
    return default


# A dataclass field with its type: `lr: float=1e-4`, `model_name: str="PATH/to/LLAMA/7B"` (llama-recipes' configs).
_TYPED_DEFAULT = re.compile(r"^(?:str|int|float|bool|Optional\[\w+\]|Union\[[\w, ]+\]|List\[\w+\])\s*=\s*(\S.*)$")
# Megatron's argument dump at start-up: `  micro_batch_size ................................ 8`.
_DOTTED_ARG = re.compile(r"^[ \t]*(?:\[[^\]\n]{0,40}\][ \t]*)?(?P<k>[a-z_][a-z0-9_]{1,60}) \.{3,}[ \t]?"
                         r"(?P<v>[^\s.][^\s]{0,80})[ \t]*$")


def structured(lines: list[tuple[int, str]], facts: Facts, source: str) -> None:
    """YAML and pretty-printed JSON (nested keys become dotted paths) plus `key = value` lines."""
    # (indent, key, opened with a brace): a JSON block pasted flush left ("ds_config.json为:" then `{` /
    # `"zero_optimization": {` / `"stage": 2,` all at column 0) nests by its braces, not by indentation.
    stack: list[tuple[int, str, bool]] = []
    for n, s in lines:
        if not s.strip() or s.lstrip().startswith("#"):
            continue
        indent = len(s) - len(s.lstrip(" \t"))
        while stack and not stack[-1][2] and indent <= stack[-1][0]:
            stack.pop()
        stripped = s.strip()
        if stripped in ("}", "},", ")", "),"):
            while stack and not stack[-1][2]:
                stack.pop()
            if stack and stripped.startswith("}"):
                stack.pop()
            continue
        if stripped.startswith('{"') and stripped.endswith("}") and len(stripped) < 5000:
            try:  # a whole JSON object on one line after some prose: `{"zero_optimization": {"stage": 2}}`
                obj = json.loads(stripped)
            except (ValueError, RecursionError):
                obj = None
            if isinstance(obj, dict) and not any(str(k).lower() in _RECORD_KEYS for k in obj):  # a log record is no config
                for sub, sv in flatten(obj):
                    _set_config(facts, sub, sv, n, stripped[:300], source)
            continue
        m = _DOTTED_ARG.match(s) if "..." in s else None
        if m:
            if m.group("v") not in ("None", "none"):
                _set_config(facts, m.group("k"), m.group("v"), n, stripped, source)
            continue
        m = _BLOCK_OPEN.match(s)
        if m:
            stack.append((indent, m.group("k"), "{" in s[m.end("k"):]))
            continue
        m = _KV_LINE.match(s)
        if not m:
            continue
        value = m.group("v").strip().rstrip(",").rstrip()
        if len(value) > 300:
            continue
        typed = _TYPED_DEFAULT.match(value)
        if typed and m.group("sep") == ":":
            value = typed.group(1)
        k, raw = m.group("k"), _clean_value(value)
        if raw.startswith("{") and raw.endswith("}"):
            v = raw
            try:
                for sub, sv in flatten(json.loads(v), k):
                    _set_config(facts, sub, sv, n, stripped, source)
            except ValueError:
                pass
            continue
        got = _line_value(strip_comment(value), m.group("sep"))
        if got is None:
            continue
        v = got
        if canonical_key(k) == "gpu":  # "GPU: NVIDIA GeForce RTX 2080 Ti. Max memory: 22.0 GB.": the card, not "NVIDIA"
            card = GPU_NAME.search(value)
            v = card.group(0) if card else v
        path = ".".join([x for _, x, _ in stack] + [k])
        # `lr=1e-5 fixes it`: a setting line whose trailing words say it is what worked.
        at = s.find(v, m.start("v")) if v else -1
        fix = at >= 0 and said_as_fix(s, m.start("k"), at + len(v))
        if _set_config(facts, path, v, n, stripped, source, fix=fix) is None and path != k:
            _set_config(facts, k, v, n, stripped, source, fix=fix)


# A dict printed by Python (`{'loss': nan, 'grad_norm': nan, ...}`): single-quoted keys are not JSON.
_PY_REPR = re.compile(r"\{\s*'[^'\n]*'\s*:")


_RECORD_KEYS = {"loss", "grad_norm", "epoch", "step", "global_step", "global_step/max_steps"}
_PY_NAMES = {"True": True, "False": False, "None": None, "nan": math.nan, "inf": math.inf}


def _py_literal(t: str) -> Any:
    """A Python literal as `repr` prints it (dicts, lists, numbers, strings, True / None / nan / inf), or None."""
    if len(t) > 200_000:
        return None
    try:
        tree = ast.parse(t, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None

    def value(node: ast.AST) -> Any:
        # Only what JSON can hold: a bytes, complex or Ellipsis constant makes it something else than a config.
        if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, str | int | float)):
            return node.value
        if isinstance(node, ast.Name) and node.id in _PY_NAMES:
            return _PY_NAMES[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            v = value(node.operand)
            if isinstance(v, int | float) and not isinstance(v, bool):
                return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.List | ast.Tuple):
            return [value(x) for x in node.elts]
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {str(value(k)): value(v) for k, v in zip(node.keys, node.values)}
        raise ValueError("not a literal")

    try:
        return value(tree)
    except (ValueError, TypeError, RecursionError):
        return None


def whole_json(text: str, lines: list[tuple[int, str]], facts: Facts, source: str) -> None:
    """A paste that is one JSON document (DeepSpeed config, trainer_state.json); truncated JSON -> a warning."""
    t = text.strip()
    if not t.startswith("{"):
        return
    if too_deep(t):
        facts.warnings.append(f"{source}: JSON nested too deeply to read as a whole; read it line by line")
        return
    if _PY_REPR.match(t):
        # Python's repr of a dict: a printed config (`{'fp16': True, ...}`) is read as one; metric records
        # (`{'loss': nan, 'grad_norm': nan, ...}`, HF Trainer log lines) and anything else are read line by line.
        obj = _py_literal(t)
        if isinstance(obj, dict) and any(str(k).lower() in _RECORD_KEYS for k in obj):
            return
    else:
        obj = _json_document(t, facts, source)
        if isinstance(obj, dict) and any(str(k).lower() in _RECORD_KEYS for k in obj) and "log_history" not in obj:
            return  # ms-swift logs JSON records (`{"loss": NaN, "learning_rate": ...}`): read line by line as logs
    if isinstance(obj, dict):
        for path, v in flatten(obj):
            _set_config(facts, path, v, _line_of(lines, path, 1), f"{path}: {json.dumps(v)}", source)
        hist = obj.get("log_history")
        if isinstance(hist, list):
            # trainer_state.json: one metric record per entry, same rules as log lines.
            from kb.facts import logs

            synthetic = [(1, json.dumps(h)) for h in hist if isinstance(h, dict)]
            logs.metric_facts(logs.parse_metric_records(synthetic), facts, source)


def _json_document(t: str, facts: Facts, source: str) -> Any:
    """`t` parsed as JSON, or read up to its last complete value when truncated (with a warning), or None."""
    try:
        return json.loads(t)
    except ValueError as e:
        obj = _close_truncated(t)
        if obj is None:
            facts.warnings.append(f"{source}: looks like JSON but does not parse ({e}); read it line by line")
        else:
            facts.warnings.append(f"{source}: JSON is truncated ({e}); read what is there")
        return obj


def _closers_at(t: str, cuts: list[int]) -> dict[int, str]:
    """For each cut point c: the brackets `t[:c]` still owes, innermost first ("" if c is inside an open string).

    One pass over `t` for all cut points (a pass per cut point made a 100 KB paste cost seconds)."""
    want = set(cuts)
    out: dict[int, str] = {}
    stack: list[str] = []
    in_str = esc = False
    last = max(cuts, default=0)
    for i in range(last + 1):
        if i in want:
            out[i] = "" if in_str else "".join(reversed(stack))
        if i == len(t):
            break
        ch = t[i]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    return out


def _close_truncated(t: str) -> Any:
    """A JSON document cut off mid-way, read up to its last complete value (None if that does not help).

    Cut points are tried from the end: before a comma, after an opening or closing bracket, so a half-written
    `"overlap_comm": tr` or a dangling `"key":` is dropped and the rest is closed with the brackets it owes."""
    t = t.rstrip()
    cuts = [len(t)]
    for i in range(len(t) - 1, max(-1, len(t) - 4000), -1):
        if t[i] == ",":
            cuts.append(i)
        elif t[i] in "{[}]":
            cuts.append(i + 1)
        if len(cuts) > 60:
            break
    owed = _closers_at(t, cuts)
    for c in cuts:
        body = t[:c]
        closing = owed[c]
        if not closing and body != t:
            continue
        try:
            return json.loads(body + closing)
        except ValueError:
            continue
    return None


_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def _variable_argument(s: str, m: re.Match) -> bool:
    """A keyword argument of a Python call whose value is a variable (`Trainer(model=model, args=training_args)`,
    `from_pretrained(path, torch_dtype=dtype)`): a name in code, not the run's setting. Literals (`fp16=True`,
    `lr=1e-4`, `"left"`, `torch.float16`) and `key=value` outside a call's parentheses (hydra overrides, prose)
    are settings."""
    v = m.group("v")
    if not _IDENTIFIER.fullmatch(v) or v in ("True", "False", "None"):
        return False
    before = s[:m.start()]
    return before.count("(") > before.count(")")


def inline(lines: list[tuple[int, str]], facts: Facts, source: str,
           shell: dict[str, tuple[str, int, str]] | None = None) -> None:
    """`key=value` inside Python calls and prose, `--flag value` fragments, `model.half()`, autocast."""
    shell = shell or {}
    for i, (n, s) in enumerate(lines):
        for m in _INLINE_KV.finditer(s):
            if s[m.end():m.end() + 1] == "(":  # `model = AutoModel.from_pretrained(`: a call, not a value
                continue
            if _variable_argument(s, m):  # `Trainer(model=model, args=training_args)`: names, not settings
                continue
            if canonical_key(m.group("k")) or m.group("k").lower() in ("fp16", "bf16", "half"):
                _set_config(facts, m.group("k"), _expand(_clean_value(m.group("v")), shell), n, s.strip(), source,
                            fix=said_as_fix(s, m.start(), m.end()))
        if "add_argument" in s:
            # argparse: `parser.add_argument("--max_seq_len", type=int, default=512)` is the script's default (a
            # command line's flag, kind "config", still wins); the flag's name alone is no switch turned on
            m = _ADD_ARGUMENT.search(s)
            if m and m.group("v") is not None:
                _set_config(facts, m.group("k"), _clean_value(m.group("v")), n, s.strip(), source, kind="text")
            continue
        if "--" in s:
            for m in _FLAG.finditer(s):
                v = m.group("v")
                _set_flag(facts, m.group("k"), _expand(_clean_value(v), shell) if v else "true", n, s.strip(), source,
                          fix=said_as_fix(s, m.start(), m.end()))
        for m in _PROSE_KV.finditer(s):
            if canonical_key(m.group("k")) and not re.search(r"[:=]\s*$", s[: m.start()]):
                _set_config(facts, m.group("k"), m.group("v"), n, s.strip(), source, kind="text",
                            fix=said_as_fix(s, m.start(), m.end()))
        m = _FROM_PRETRAINED.search(s)
        if m:
            # The model id is the first positional argument, on this line or alone on the next one.
            name = m.group("m")
            if name is None and s[m.end():].strip() == "" and i + 1 < len(lines):
                nxt = _QUOTED_ARG.match(lines[i + 1][1])
                name = nxt.group("m") if nxt else None
            if name and ("/" in name or re.search(r"\d", name)):
                facts.set("model", name, "config", n, s.strip(), source)
        m = _HALF_CALL.search(s)
        if m:
            _set_config(facts, "model.half", "half", n, s.strip(), source, fix=said_as_fix(s, m.start(), m.end()))
        m = _AUTOCAST.search(s)
        if m:
            d = m.group("d") or "fp16"
            _set_config(facts, "mixed_precision", d, n, s.strip(), source)


# `export CUDA_VISIBLE_DEVICES=1,6,7 && torchrun ...`: the command after the assignments.
_EXPORT_THEN = re.compile(r"^[ \t]*(?:export[ \t]+[A-Za-z_]\w*=\S*[ \t]*&&[ \t]*)+")
# A command quoted in backticks, after a label or not ("执行命令：`llamafactory-cli train x.yaml`", "```python x.py```").
_QUOTED_COMMAND = re.compile(r"^(?:[^`\n]{0,24}?(?:[:：]|\bwith|\b(?:run|ran|running|launch|launched|execute|executed)"
                             r"(?: it)?(?: with)?)[ \t]*)?`{1,3}([^`\n]+)`{1,3}[ \t]*[.。]?$", re.IGNORECASE)


def logical_commands(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Join backslash continuations; keep lines that start (after VAR=x assignments) with a launcher."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for n, s in lines:
        if not buf and s.lstrip().startswith("#"):
            continue  # `# torchrun --nproc_per_node=3`: a command commented out, never run
        if not buf:
            start = n
            s = _RUN_PREFIX.sub("", s)  # "运行 torchrun ...", "I run torchrun ...": the command after the words
        cont = s.rstrip().endswith("\\")
        buf.append(s.rstrip().rstrip("\\"))
        if cont:
            continue
        joined = _QUOTED_COMMAND.sub(r"\1", " ".join(x.strip() for x in buf))
        joined = joined.lstrip("`") if joined.startswith("`") else joined  # "``CUDA_VISIBLE_DEVICES=0 python3 ...", "`..."
        joined = _EXPORT_THEN.sub("", joined)
        buf = []
        toks = joined.split()
        i = 0
        while i < len(toks) and _ENV_ASSIGN.match(toks[i]):
            i += 1
        i = _unwrap(toks, i)
        if i < len(toks) and (toks[i].lower() in _LAUNCHERS or toks[i].endswith(".py") or toks[i].endswith(".sh")
                              or _SWIFT_MEGATRON.match(" ".join(toks[i:i + 2]))):
            out.append((start, joined))
    if buf:
        out.append((start, " ".join(x.strip() for x in buf)))
    return out


def command(n: int, cmd: str, facts: Facts, source: str, shell: dict[str, tuple[str, int, str]] | None = None) -> None:
    detail = cmd if len(cmd) < 300 else cmd[:297] + "…"
    shell = shell or {}
    try:
        toks = shlex.split(cmd, comments=False)
    except ValueError:
        toks = cmd.split()
    env: dict[str, str] = {}
    while toks and _ENV_ASSIGN.match(toks[0]):
        k, _, v = toks.pop(0).partition("=")
        env[k] = v
    del toks[:_unwrap(toks)]
    if len(toks) >= 2 and toks[1] in ("=", "==", ":", "："):
        return  # "TRL = 0.21.0" in an issue form's version list: a name and its value, not the `trl` command
    _launch_devices(env, facts, n, detail, source)
    m = re.search(r"--include[ =]['\"]?[\w.\-]+:(\d+(?:,\d+)*)['\"]?(?:\s|$)", cmd) if "--include" in cmd else None
    if m and "num_gpus" not in facts:  # `deepspeed --include localhost:1,2,3`: one host, three devices
        facts.set("num_gpus", len(m.group(1).split(",")), "config", n, detail, source)
    if not toks:
        return
    head = toks[0].lower()
    lowered = [t.lower() for t in toks]
    joined = " ".join(lowered)

    def fw(name: str, kind: str = "config") -> None:
        facts.set("framework", name, kind, n, detail, source)

    def algo(name: str | None, kind: str = "config") -> None:
        if name:
            facts.set("algorithm", name, kind, n, detail, source)

    if head == "swift" or _SWIFT_MEGATRON.match(joined):  # `megatron sft`: ms-swift's Megatron-SWIFT command
        fw("ms-swift")
        sub = lowered[1] if len(lowered) > 1 else ""
        algo({"sft": "SFT", "pt": "pretrain"}.get(sub))
    elif head == "llamafactory-cli" or re.search(r"src/train(?:_bash)?\.py", joined):
        fw("LLaMA-Factory")
    elif "verl.trainer" in joined:
        fw("verl")
        if "main_ppo" in joined and "adv_estimator" not in joined:
            algo("PPO", "text")
    elif "openrlhf.cli" in joined:
        fw("OpenRLHF")
    elif head == "xtuner":
        fw("xtuner")
    elif head == "trl" and len(toks) > 1 and not re.match(r"v?\d", lowered[1]):  # `trl 0.11.4`: a version list
        fw("trl")
        algo(canonical_algorithm(lowered[1]))
    # (a plugin file passed as a flag's value, `--external_plugins custom_reward.py`, is no entry script)
    scripts = [t for i, t in enumerate(toks) if (".py" in t and not (i and _PLUGIN_FLAG.match(toks[i - 1])))
               or t.startswith("openrlhf.cli") or "verl.trainer" in t]
    for sc in scripts:
        base = re.sub(r".*?(?=train_)", "", sc.rsplit("/", 1)[-1]) if "train_" in sc else sc.rsplit("/", 1)[-1]
        m = _SCRIPT_ALGO.search(base.replace(".py", ""))
        # verl's main_ppo runs every RL algorithm; OpenRLHF's train_ppo_ray too, named by --advantage_estimator
        if m and "verl.trainer" not in sc and not ("advantage_estimator" in joined and "ppo" in base):
            algo(canonical_algorithm(m.group(1).replace("_", " ").replace("reward modeling", "reward modeling")),
                 "config")
        if re.search(r"train_(?:kto|dpo|rm|ppo|sft|grpo)\.py", sc) and head == "deepspeed" and "framework" not in facts:
            fw("OpenRLHF", "text")  # OpenRLHF's pre-0.4 entry scripts; weak, hence "text"
        if "examples/scripts/" in sc or "open_r1/" in sc:  # open-r1's src/open_r1/grpo.py runs TRL's GRPOTrainer
            fw("trl", "text")
    # --key value / --key=value / --flag, and hydra overrides a.b.c=value
    i = 1
    while i < len(toks):
        t = toks[i]
        if t.startswith("--") and len(t) > 2:
            if "=" in t:
                k, v = t[2:].split("=", 1)
                i += 1
            elif i + 1 < len(toks) and not toks[i + 1].startswith("--"):
                k, v = t[2:], toks[i + 1]
                i += 2
            else:
                k, v = t[2:], "true"
                i += 1
            _set_flag(facts, k, _expand(_clean_value(v), shell), n, detail, source)
            continue
        if "=" in t and not t.startswith("-"):
            k, v = t.split("=", 1)
            if re.fullmatch(r"[+~]?[A-Za-z_][\w.]*", k):
                _set_config(facts, k.lstrip("+~"), _expand(_clean_value(v), shell), n, detail, source)
        i += 1


def extract(lines: list[tuple[int, str]], facts: Facts, source: str) -> None:
    text = "\n".join(s for _, s in lines)
    whole_json(text, lines, facts, source)
    shell = shell_variables(lines)
    for n, cmd in logical_commands(lines):
        command(n, cmd, facts, source, shell)
    exported = [k for k in ("NPROC_PER_NODE", *_VISIBLE_DEVICES) if k in shell]
    if exported and "num_gpus" not in facts and "nproc_per_node" not in facts:
        # `export CUDA_VISIBLE_DEVICES=1,2,3` on a line of its own, before the launcher
        _, n, line = shell[exported[0]]
        _launch_devices({k: shell[k][0] for k in exported}, facts, n, line, source)
    structured(lines, facts, source)
    inline(lines, facts, source, shell)
