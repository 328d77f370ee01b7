"""The closed sets of values that config settings accept.

Why Enums and not ``Literal``: OmegaConf types a node from its annotation and supports
Enums but not ``typing.Literal``. With an Enum, Hydra rejects ``-S train.parallel=fdsp``
while composing, naming the key and the allowed values, instead of the stage failing
after the earlier stages already ran.

Why ``str`` Enums whose member names equal their values: the stages compare settings with
plain strings (``cfg.hardware.device == "cpu"``), hash them as dict keys, pass them to
torch / transformers / vLLM command lines and write them to JSON metrics and manifests.
A ``str`` member equals, hashes and JSON-encodes as its value, and :class:`Choice` makes
``str()`` and f-strings give the value too (a plain ``(str, Enum)`` would give
``Device.cpu`` there). ``OmegaConf.to_yaml`` writes the member name, i.e. the value.
"""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """Base of every choice: behaves as its plain string value everywhere but ``repr``."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(str(self), format_spec)


class Device(Choice):
    cpu = "cpu"
    cuda = "cuda"


class Dtype(Choice):
    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"


class DataSource(Choice):
    builtin = "builtin"  # pydoc_data.topics, present on every Python install
    file = "file"  # a local JSON/JSONL file (data.path)
    hf = "hf"  # a Hugging Face dataset (data.path = its id)


class DataFormat(Choice):
    auto = "auto"
    sharegpt = "sharegpt"
    openai = "openai"


class OnError(Choice):
    skip = "skip"  # count bad records and go on
    fail = "fail"  # the first bad record fails the stage


class RoleRule(Choice):
    """How a conversation's roles are checked (``data.roles``)."""

    any = "any"  # any order of known roles (system, user, assistant and their aliases)
    # EAGLE's rule for ShareGPT: drop leading turns until a human one, then human and
    # assistant strictly alternate (a conversation that breaks it is skipped, counted)
    eagle = "eagle"


class PromptSet(Choice):
    """A validation prompt set (``validate.prompt_sets``)."""

    heldout = "heldout"  # conversations of the training source that training never saw
    mt_bench = "mt_bench"  # MT-Bench's 80 two-turn questions, 8 categories x 10
    humaneval = "humaneval"  # HumanEval's 164 Python problems


# Prompts in each fixed set (``heldout``'s is data.heldout_size): what validate.num_prompts
# is checked against at compose, and what a fetched file must hold.
PROMPT_SET_SIZES: dict[str, int] = {"mt_bench": 80, "humaneval": 164}


class Reasoning(Choice):
    keep = "keep"
    drop = "drop"


class RegenerateBackend(Choice):
    hf = "hf"  # in-process transformers generation
    server = "server"  # an OpenAI-compatible server (data.server)


class ExtractBackend(Choice):
    hf = "hf"  # transformers, CPU or GPU
    vllm = "vllm"  # vllm serve + speculators' client, GPU


class ExtractMode(Choice):
    offline = "offline"  # hidden states written to data/hidden_states (DVC's cache)
    online = "online"  # a vLLM server makes them during training; nothing is stored


class OnMismatch(Choice):
    refuse = "refuse"  # fail the stage
    restart = "restart"  # discard the other run's files (never mix them)


class DraftLayerType(Choice):
    """The EAGLE-3 draft decoder layers vLLM serves."""

    llama = "llama"
    qwen3 = "qwen3"
    mla = "mla"  # one DeepSeek-V3 MLA layer (the Kimi drafts): an MLA target only


class OptimizerName(Choice):
    adamw = "adamw"
    muon = "muon"  # speculators' split: Muon on 2-D matrices, AdamW on the rest


class Scheduler(Choice):
    cosine = "cosine"
    linear = "linear"
    none = "none"


class AttnImplementation(Choice):
    sdpa = "sdpa"
    sdpa_packed = "sdpa_packed"  # SDPA per packed row: skips the masked blocks (CPU default)
    eager = "eager"
    simple_flex_attention = "simple_flex_attention"  # CUDA only (no CPU backward)


class LossName(Choice):
    """speculators' per-position losses (``train.loss`` is one of these, or a JSON dict of
    them to weights, e.g. ``{"ce": 0.1, "tv": 0.9}``)."""

    kl_div = "kl_div"
    rkl = "rkl"
    jsd = "jsd"
    ce = "ce"
    tv = "tv"
    nla = "nla"
    lk_hybrid = "lk_hybrid"


class LossImplementation(Choice):
    eager = "eager"  # speculators' eager losses
    cpu = "cpu"  # speculators' eager losses, the forward KL as one autograd function (CPU)
    fused = "fused"  # speculators' Triton kernels (CUDA)


class CheckpointMeasure(Choice):
    """Which epoch's draft the train stage writes (``train/select.py``)."""

    val_acceptance = "val_acceptance"  # 1 + the summed per-position accuracies, held out
    val_loss = "val_loss"  # the lowest held-out loss
    last = "last"  # the last epoch's, whatever its figures


class Parallel(Choice):
    auto = "auto"
    ddp = "ddp"
    fsdp = "fsdp"  # FSDP2 fully_shard


class Evaluator(Choice):
    """How our evaluator decodes (T=0): the same counts either way."""

    replay = "replay"  # the target's greedy answers in batches, the draft replayed over them
    chained = "chained"  # speculative decoding prompt by prompt, a target forward per step


class VllmMode(Choice):
    offline = "offline"  # vllm.LLM in a worker process
    serve = "serve"  # vllm serve + HTTP (validate.server)


class FingerprintMode(Choice):
    """How a local target's weight shards enter its fingerprint (small files always by
    content): ``stat`` by size and modification time, ``content`` by SHA-256."""

    stat = "stat"
    content = "content"


class TinyArchitecture(Choice):
    """The target families the ``target`` stage builds a tiny member of: those with a tiny
    builder in ``targets/families`` (declared here so that the config, below the targets,
    checks ``model.tiny.architecture`` itself; tests/targets/test_families.py keeps the two equal)."""

    kimi_k25 = "kimi_k25"
    llama = "llama"
    qwen3_moe = "qwen3_moe"
