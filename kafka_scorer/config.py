"""Settings: the only place that reads the environment.

Precedence (highest first): CLI flags (applied by the CLI as init kwargs), `KAFKA_SCORER_*`
environment variables, a `.env` file, defaults. Validation happens here so that a bad value fails at
start with the setting's name instead of deep inside aiokafka or torch.
"""

from __future__ import annotations

import typing
from dataclasses import fields
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from kafka_scorer.setting_values import host_ports, readable_file, topic_priorities

if TYPE_CHECKING:
    from kafka_scorer.engine.config import EngineConfig

DeliveryMode = Literal["at_least_once", "exactly_once"]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]
DType = Literal["auto", "float32", "float16", "bfloat16"]
AttentionBackend = Literal["auto", "dense", "cascade", "flex", "spans", "varlen"]
DecoderForward = Literal["auto", "fused", "compiled", "transformers"]


def choices(annotation: object) -> tuple[str, ...]:
    """The allowed strings of a `Literal[...]` (or `Literal[...] | None`) setting; () for any other."""
    if typing.get_origin(annotation) is Literal:
        return tuple(a for a in typing.get_args(annotation) if isinstance(a, str))
    return tuple(c for arg in typing.get_args(annotation) for c in choices(arg))


class EngineSettings(BaseSettings):
    """What the engine needs; usable without any Kafka setting (`settings.engine_config()`)."""

    model_config = SettingsConfigDict(env_prefix="KAFKA_SCORER_", env_file=".env", extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _any_case_choices(cls, data: object) -> object:
        """`info`, `Info` and `INFO` all mean `INFO`: a value of a fixed set is matched whatever its case."""
        if not isinstance(data, dict):
            return data
        fixed = dict(data)
        for name, field in cls.model_fields.items():
            value, allowed = fixed.get(name), choices(field.annotation)
            if isinstance(value, str) and allowed and value not in allowed:
                match = [c for c in allowed if c.lower() == value.strip().lower()]
                if match:
                    fixed[name] = match[0]
        return fixed

    model: str = Field("", description="Local model directory or Hugging Face id to serve.")
    served_model_name: str | None = Field(
        None, description="Name reported in results and matched against a job's `model`; default: `model`."
    )
    dtype: DType = Field(
        "auto",
        description=(
            "Weights and activations dtype; auto: bfloat16 on CUDA; on a CPU, bfloat16 where it computes "
            "bf16 natively (AVX512-BF16, AMX) and the kind's rankings held in it (docs/performance.md), "
            "else float32."
        ),
    )
    device: str = Field(
        "auto", description="torch device: auto (cuda if available, else cpu), cpu, cuda, cuda:1 ..."
    )
    trust_remote_code: bool = Field(
        False, description="Allow model code from the checkpoint (off by default)."
    )
    attention_backend: AttentionBackend = Field(
        "auto",
        description="MIS/varlen attention. auto: flex on CUDA when it passes the start-up warm-up, else "
        "cascade; cascade: shared-prefix attention whose cost follows the mask; flex: FlexAttention with a "
        "block mask; spans: a Triton kernel that walks each query tile's own key spans (CUDA; opt-in, "
        "its speed not yet measured); varlen: FlashAttention-2's variable-length kernel over each item's "
        "own keys (CUDA, 16-bit; opt-in, not yet measured); dense: SDPA with an explicit mask (the "
        "reference).",
    )
    decoder_forward: DecoderForward = Field(
        "auto",
        description="Decoder layers (Qwen2/3, Llama, Mistral, Gemma 2). auto: the engine's fused layers, "
        "compiled at warm-up on CUDA and eager on the CPU; fused: eager; compiled: compiled on any device "
        "(about 1.03-1.08x on the CPU for 12 s at start-up); transformers: the checkpoint's own layers (the "
        "reference). Compiled layers that fail at warm-up (no C/C++ compiler, say) run eagerly.",
    )
    max_batch_tokens: int = Field(
        0,
        ge=0,
        description="Token budget of one forward pass. 0: by device, 16384 on CUDA (95 % of 32768's "
        "throughput at half its forward time, docs/performance.md) and 8192 on the CPU.",
    )
    max_items_per_job: int = Field(1024, gt=0, description="Jobs with more items are rejected (`too_long`).")
    max_pair_tokens: int = Field(
        0, ge=0, description="Longest allowed pair (or packed MIS sequence); 0: the model's context length."
    )
    truncate: bool = Field(
        False,
        description="Default of a job's `truncate`: cut an item too long for the pair limit from its end "
        "(listed in `truncated_items`) instead of answering `too_long`.",
    )
    max_labels_per_job: int = Field(
        256,
        gt=0,
        description="Jobs with more `label_token_ids` are rejected (`too_long`); every row of a batch is "
        "padded to its longest label list, so one job must not widen everyone's.",
    )
    chunking: str = Field(
        "",
        json_schema_extra={"metavar": "JSON"},
        description="Default of a job's `chunking`, as its JSON object, e.g. "
        '`{"aggregate": "max", "overlap": 64}`: score every window of an item too long for one pair '
        "(docs/message-schema.md, Long items); empty: none. Not together with `truncate`.",
    )
    max_chunks_per_job: int = Field(
        256,
        gt=0,
        description="Most windows the chunked items of one job may make; more is `too_long`. Every window "
        "is a pair run through the model, so this bounds one job's work like `max_items_per_job`.",
    )
    max_images_per_job: int = Field(
        32,
        gt=0,
        description="Most images one job may carry, query and every item or document together; more is "
        "`invalid_request`. Vision-language models only (docs/message-schema.md, Images).",
    )
    max_image_bytes: int = Field(
        10 * 2**20,
        gt=0,
        description="Largest image, in bytes as sent (after base64 decoding); larger is `invalid_request`.",
    )
    max_image_pixels: int = Field(
        7680 * 4320,
        gt=0,
        description="Most pixels (width x height, read from the header before decoding) of one image; "
        "more is `invalid_request`, so a decompression bomb is never decoded. Accepted images are "
        "scaled to the model processor's own pixel range. Default: an 8K frame.",
    )
    template: str = Field(
        "",
        description="Prompt template for text jobs: a preset (qwen3-reranker, qwen3-vl-reranker, "
        "mxbai-rerank-v2, bge-reranker-v2-gemma) or a file with {instruction}, {query} and {item}; "
        "empty: none (docs/message-schema.md, Templates).",
    )
    model_revision: str = Field(
        "",
        description="Revision reported in every result; empty: a hash of the checkpoint's config, weight "
        "and tokenizer files, computed at start-up.",
    )
    prefix_cache_mb: int = Field(
        -1,
        ge=-1,
        description="Device memory (MiB) for the prefix cache: key/value states of recurring prompt heads "
        "(a template's text before the query, a repeated query), computed once per worker and reused by "
        "every job that starts with them (docs/engine.md). A head it may keep is computed alone first, "
        "so the same job sent again gets the same scores bit for bit, hit or miss (one more forward per "
        "batch with a new head: docs/performance.md). A hybrid model's (Qwen3.5, Qwen3-Next) heads keep "
        "their Gated DeltaNet layers' states too. -1: sized for the model (8192 tokens' states, at most "
        "512 MiB); 0: off. Never used for encoders or sliding-window models.",
    )
    embedding_cache_mb: int = Field(
        -1,
        ge=-1,
        description="Device memory (MiB) for the document embedding cache of a late-interaction (ColBERT) "
        "model: a document's token vectors, kept by the hash of its token ids, so a document re-ranked "
        "against many queries is encoded once (docs/engine.md); of a vision-language model: each image's "
        "vision-tower output, kept by the hash of its pixels, so an image seen again is not encoded again. "
        "-1: 256 MiB; 0: off. Other kinds ignore it.",
    )
    deterministic: bool = Field(
        False,
        description="Scores bit-identical for the same job whatever its batch-mates, its place in the "
        "packed stream and the prefix or embedding cache's state: fixed-shape matmul blocks, attention "
        "by each token's own run, the caches kept on the CPU (on CUDA the prefix cache is off) "
        "(docs/engine.md, Deterministic mode; its cost in docs/performance.md). Encoders, ColBERT "
        "models and decoders with the engine's own layers.",
    )
    cuda_graph_tokens: int = Field(
        -1,
        ge=-1,
        description="Forwards of up to this many tokens are padded to a token bucket and replayed from a "
        "CUDA graph captured at warm-up, instead of launching each kernel from Python (docs/engine.md, CUDA "
        "graphs). -1: 8192 on CUDA, none on the CPU; 0: off. Decoders with the engine's own layers and "
        "the flex attention backend only; never in deterministic mode.",
    )

    @field_validator("chunking")
    @classmethod
    def _chunking_decodes(cls, value: str) -> str:
        """The job field's own decoder reads the setting, so it accepts exactly what a job may send."""
        from kafka_scorer.wire.protocol import parse_chunking

        parse_chunking(value)
        return value.strip()

    @model_validator(mode="after")
    def _one_long_item_policy(self) -> EngineSettings:
        if self.truncate and self.chunking:
            raise ValueError("truncate, chunking: both set; an item too long for a pair is cut or chunked")
        return self

    def engine_config(self) -> EngineConfig:
        """The plain record the engine is built from (`Scorer.from_config`, its kind chosen in
        `engine/kinds/choice.py`): the engine reads no settings."""
        from kafka_scorer.engine.config import EngineConfig

        return EngineConfig(**{f.name: getattr(self, f.name) for f in fields(EngineConfig)})

    @field_validator("template")
    @classmethod
    def _template_loads(cls, value: str) -> str:
        """A template that cannot be used is an operator mistake: said at start, never per job."""
        from kafka_scorer.engine.prepare.templates import TemplateError, load_template

        try:
            load_template(value)
        except TemplateError as exc:
            raise ValueError(str(exc)) from None
        return value


class Settings(EngineSettings):
    """Worker settings: engine settings plus Kafka, batching, limits and delivery."""

    bootstrap_servers: str = Field("localhost:9092", description="Comma-separated Kafka bootstrap servers.")
    request_topics: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["scoring-requests"],
        description="Topics to consume jobs from (comma-separated).",
    )
    request_topic_pattern: str | None = Field(
        None, description="Regex of topics to consume (overrides request_topics)."
    )
    reply_topic: str = Field(
        "scoring-results", description="Default topic for results (a `reply_topic` header wins)."
    )
    dead_letter_topic: str | None = Field(
        None, description="Topic for undecodable records; default: the request topic + `.DLT`."
    )
    group_id: str = Field(
        "kafka-scorer", description="Consumer group id; workers in one group share partitions."
    )
    client_id: str = Field("kafka-scorer", description="Kafka client id.")
    group_instance_id: str | None = Field(
        None,
        description="Static group membership: a worker restarted with the same id takes its partitions back "
        "without a rebalance (unset: dynamic membership).",
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a new group starts."
    )

    security_protocol: SecurityProtocol = Field("PLAINTEXT", description="Kafka security protocol.")
    sasl_mechanism: SaslMechanism | None = Field(None, description="SASL mechanism for SASL_* protocols.")
    sasl_username: str | None = Field(None, description="SASL user name.")
    sasl_password: SecretStr | None = Field(
        None, description="SASL password (never logged or shown: repr and errors print `**********`)."
    )
    ssl_cafile: str | None = Field(None, description="CA bundle for SSL/SASL_SSL (PEM file).")
    ssl_certfile: str | None = Field(
        None, description="Client certificate for mutual TLS (PEM file; may hold the key too)."
    )
    ssl_keyfile: str | None = Field(None, description="Client key for mutual TLS (PEM file).")

    max_batch_wait_ms: int = Field(
        5, ge=0, description="Longest a job waits for a batch to fill while the device has no batch ahead."
    )
    max_inflight_tokens: int = Field(
        65536, gt=0, description="Queued + running tokens above which partitions are paused (backpressure)."
    )
    max_job_age_ms: int = Field(
        0,
        ge=0,
        description="Deadline of jobs without `timeout_ms`, from their record's timestamp: a job older than "
        "this when its forward pass would start is answered `deadline_exceeded`, uncomputed; 0: off.",
    )
    topic_priorities: Annotated[dict[str, int], NoDecode] = Field(
        default_factory=dict,
        json_schema_extra={"metavar": "TOPIC=N,..."},
        description="Default `priority` of each request topic, as TOPIC=N,TOPIC=N (e.g. "
        "scoring-bulk=-1,scoring-interactive=1); other topics: 0. Backpressure pauses lower ones first.",
    )
    scheduling: Literal["priority", "fifo"] = Field(
        "priority",
        description="priority: batches fill from the highest priority first, earliest deadline first within "
        "one, with a share for jobs that waited long (priority_starve_ms, priority_share); fifo: in "
        "arrival order, priorities ignored.",
    )
    priority_starve_ms: int = Field(
        2000,
        ge=0,
        description="A queued job below the highest queued priority that has waited this long is starving: "
        "every batch reserves priority_share of its token budget for starving jobs, which go first, oldest "
        "first.",
    )
    priority_share: float = Field(
        0.125,
        json_schema_extra={"metavar": "FRACTION"},
        gt=0,
        le=1,
        description="Share of each batch's token budget reserved for starving lower-priority jobs, which "
        "go before the higher priorities fill the rest; a starving job larger than that goes once the "
        "reservations of the batches that passed it over cover it.",
    )
    max_message_bytes: int = Field(
        8 * 1024 * 1024, gt=0, description="Larger records are rejected (`too_long`) without decoding."
    )
    max_header_bytes: int = Field(
        65536,
        gt=0,
        description="Records whose headers (names + values) total more are rejected (`invalid_request`) "
        "without reading any header, so a huge correlation id is never echoed.",
    )
    delivery: DeliveryMode = Field(
        "at_least_once", description="at_least_once, or exactly_once with transactions."
    )
    transactional_id: str | None = Field(
        None,
        description="exactly_once: the producer's transactional id, unique per worker and stable across its "
        "restarts; default: `<group_id>.<client_id>.<hostname>`.",
    )
    compression: Compression = Field("none", description="Result compression codec.")
    fetch_max_wait_ms: int = Field(100, gt=0, description="Longest a fetch waits for data.")
    session_timeout_ms: int = Field(10000, gt=0, description="Consumer group session timeout.")
    heartbeat_interval_ms: int = Field(3000, gt=0, description="Consumer group heartbeat interval.")
    max_poll_interval_ms: int = Field(300000, gt=0, description="Longest gap between polls before eviction.")
    metadata_max_age_ms: int = Field(
        30000,
        gt=0,
        description="Longest a Kafka client goes without refreshing cluster metadata: partitions added to "
        "a request topic (or topics matching the pattern) are consumed within about this long. aiokafka's "
        "own default is 5 minutes.",
    )
    max_poll_records: int = Field(500, gt=0, description="Most records taken from one poll (bounds a fetch).")
    rebalance_grace_s: float = Field(
        10.0, ge=0, description="Time to answer and commit the work of revoked partitions before they go."
    )
    shutdown_grace_s: float = Field(30.0, ge=0, description="Time to answer in-flight work after SIGTERM.")
    topic_grace_s: float = Field(
        30.0,
        ge=0,
        description="Time from start for request_topics or request_topic_pattern to match a partition "
        "in the cluster; past it, /readyz answers 503 and a warning names the setting until one does.",
    )
    allow_no_tokenizer: bool = Field(
        False,
        description="Serve a model directory without tokenizer files (jobs must send token ids; text jobs "
        "are answered `unsupported`); off: such a worker refuses to start.",
    )
    schema_registry_url: str | None = Field(
        None,
        description="Confluent Schema Registry URL: JSON results are written in its framing (magic byte, "
        "schema id) under the subject `<reply topic>-value`; unset: plain JSON.",
    )
    metrics_port: int = Field(
        9400, ge=0, le=65535, description="Prometheus /metrics, /healthz, /readyz; 0: off."
    )
    metrics_host: str = Field("0.0.0.0", description="Address the metrics server binds.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")
    log_format: Literal["text", "json"] = Field("text", description="Log line format.")

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_ports(cls, value: str) -> str:
        return host_ports(value)

    @field_validator("request_topics", mode="before")
    @classmethod
    def _split_topics(cls, value: object) -> object:
        if isinstance(value, str):
            return [t.strip() for t in value.split(",") if t.strip()]
        return value

    @field_validator("topic_priorities", mode="before")
    @classmethod
    def _topic_priorities(cls, value: object) -> object:
        return topic_priorities(value) if isinstance(value, str) else value

    @field_validator("ssl_cafile", "ssl_certfile", "ssl_keyfile")
    @classmethod
    def _readable_file(cls, value: str | None) -> str | None:
        return readable_file(value)

    @model_validator(mode="after")
    def _check_consistency(self) -> Settings:
        if not self.request_topics and not self.request_topic_pattern:
            raise ValueError("request_topics: give at least one topic or a request_topic_pattern")
        self._check_security()
        if self.security_protocol.startswith("SASL") and not (
            self.sasl_mechanism and self.sasl_username and self.sasl_password
        ):
            raise ValueError(
                f"sasl_mechanism, sasl_username, sasl_password: all required with security_protocol="
                f"{self.security_protocol}"
            )
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms: must be below session_timeout_ms")
        return self

    def _check_security(self) -> None:
        """TLS and SASL settings that cannot work together; each message starts with the setting."""
        protocol = self.security_protocol
        if not protocol.endswith("SSL"):
            given = [n for n in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if getattr(self, n)]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: set, but security_protocol={protocol} does not use TLS; "
                    "set security_protocol to SSL or SASL_SSL, or unset them"
                )
        if not protocol.startswith("SASL"):
            given = [n for n in ("sasl_mechanism", "sasl_username", "sasl_password") if getattr(self, n)]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: set, but security_protocol={protocol} does not use SASL; "
                    "set security_protocol to SASL_PLAINTEXT or SASL_SSL, or unset them"
                )
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("ssl_keyfile: given without ssl_certfile; mutual TLS needs the certificate too")

    def dead_letter_topic_for(self, request_topic: str) -> str:
        return self.dead_letter_topic or f"{request_topic}.DLT"
