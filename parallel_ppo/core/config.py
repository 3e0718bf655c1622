"""The typed run configuration: one dataclass per YAML section, each field documented (the docs of `--set`) and
carrying its rules (`Rules`, in the field's metadata). The env section (`EnvConfig`) and the rules are declared
below the core, in `envs.config`, and re-exported here. Loading, overriding and validating it is
`core.configure`'s job."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from parallel_ppo.envs.config import MAX_THREADS, EnvConfig, Rules, rules_of, setting  # noqa: F401 (re-exported)

CUT_NO_EARLIER = 0.25
"""A rollout cut for the stragglers' sake (`parallel.sync_fraction`, `distributed.sync_fraction`) keeps at least this
share of its steps (DD-PPO's 0.25): no env's share of an update is a few steps."""


def share_waited_for(fraction: float, count: int) -> int:
    """How many of `count` workers or ranks a `sync_fraction` waits for: that share, rounded up, at least one."""
    return max(1, math.ceil(fraction * count - 1e-9))  # 0.14 × 50 is 7.000000000000001


@dataclass
class ParallelConfig:
    num_workers: int = setting(2, positive=True, maximum=512, command_line=True)
    """Worker processes, each stepping its own batch of envs."""
    num_envs_per_worker: int = setting(8, positive=True, command_line=True)
    """Envs in each worker's batch."""
    worker_threads: int = setting(1, positive=True, maximum=MAX_THREADS)
    """Torch/OpenMP threads in each worker process."""
    learner_threads: int | str = setting("auto", non_negative=True, maximum=MAX_THREADS, auto=True)
    """Torch threads of the process that runs the update: a number; 0 for every logical CPU this process may use
    (with `overlap` and its lag, those its workers leave); or `auto` (the default), the fewest of those that train
    as fast as all of them, measured before the run and cached (`tuning.learner_threads`; one, unmeasured, for a
    network too small to gain from more)."""
    idle_learner_threads: int | str = setting("auto", non_negative=True, maximum=MAX_THREADS, auto=True)
    """With `overlap` (and its lag) and the update on the CPU: the learner's torch threads from its first minibatch
    after every worker has collected the rollout in flight (their cores idle, waiting for the update) until the next
    rollout starts: a number; 0 for every logical CPU this process may use (a distributed rank's share); or `auto`
    (the default), the count `learner_threads: auto` chooses within all of them (one for a network too small to gain
    from more), but none with `refresh_params` off, whose runs reproduce exactly (which minibatch first runs on the
    lent threads depends on timing, and a thread count changes how sums are split). Never fewer than the learner's
    own: set 1 to keep them."""
    start_method: str = setting("forkserver", choices=("spawn", "forkserver"))
    """How workers start: forkserver (forked from a process that loaded torch, and what the env's family preloads,
    once, so workers share that memory; the default) or spawn (each worker imports everything itself)."""
    worker_timeout: float | str = setting("auto", positive=True, maximum=10**9, unit="s", auto=True)
    """Seconds a worker may neither step its envs nor use the CPU (nor, on Linux, wait for a core) before it is
    declared hung and restarted, or `auto`: 10 times what the slowest worker took to build and reset its envs, at
    least 20 s (shown at the start of a run). A worker busy in a long reset, a first frame or a JIT compilation uses
    the CPU, and one kept waiting by a busier job waits for a core, so neither is restarted for being slow."""
    max_worker_restarts: int = setting(3, non_negative=True)
    """Restarts allowed per worker slot before the run stops with an error."""
    overlap: bool = False
    """Workers collect the next rollout while the learner updates on the last one (two rollout buffers, in turn),
    instead of waiting for the update (where it outlasts their rollout, they wait for the rest of it). They start it
    with the parameters published before that update: the policy behind a rollout trails the one it updates by up to
    `policy_lag` updates (recorded per update; with `refresh_params`, only the steps taken during the update), and
    PPO's ratio, taken against the log-probabilities stored with each sample (or weighed by them: `decoupled_clip`),
    corrects for it. Off: synchronous, no lag (the reference). The sequential trainer ignores it, as it does the
    other worker settings."""
    policy_lag: int = setting(1, non_negative=True, maximum=1)
    """With `overlap`: updates by which the workers' parameters may trail the learner's. 1 lets them collect
    through the update; 0 has them wait for it, filling the two buffers in turn: the synchronous trainer's data
    and parameters through the overlapped path (for checking it), without its gain."""
    fresh_values: bool = True
    """With `overlap`: before GAE, the learner values again, with the parameters it updates, the observations of the
    steps taken with older ones (and the one after each env's last step, where that step was one of them), as the
    synchronous trainer's values are, instead of reading the values the workers stored (one forward pass over those
    steps; a time limit's bootstrap keeps its stored value; not where `drop_lagged` leaves those steps out). Off, the
    critic learns towards returns built on its own estimates of an update before (on CartPole, where nearly every
    step lags, it learned slower: docs/training.md): GAE reads the stored values."""
    decoupled_clip: bool = False
    """With `overlap`: an update whose rollout trails it clips PPO's ratio (and the value loss) around the policy
    it starts from, and weighs every step by that policy's probability of its action over the probability it was
    taken with (Hilton et al. 2022's decoupled objective; one more forward pass over the rollout, a minibatch at a
    time where frames are shifted in the loss, as `training.augment_anchor` does then): the steps taken with
    older parameters no longer count their lag as the update's own move, and approx_kl, clipfrac and target_kl
    measure that move alone. Where every step acted with the policy the update starts from, it is PPO's loss.
    Off: the ratio is clipped around the policy that took each step, which keeps a lagged step's gradient where it
    widens a policy that has narrowed since and drops it where it narrows it. With continuous actions, turn it on
    where most steps lag (an update that outlasts the rollout: on HalfCheetah it ended at about 1.6 times the return
    without it); where few do (Lift from state on 2 cores: narrower policies, a far lower success, a check written
    down in advance failed) and on CartPole's discrete actions it has not helped (docs/training.md)."""
    drop_lagged: bool = False
    """With `overlap` and `refresh_params` (refused with distributed ranks: timing would set each one's share): the
    update learns only from the steps taken with the parameters it updates, in as many minibatches as the whole
    rollout makes (each smaller); the steps taken during the update before carry their envs forward and are not
    learned from (metrics.csv's `learned_share`; the observation and reward statistics still count them). Where they
    are more than half the rollout (an update longer than a rollout), it learns from every step, as without it; with
    `decoupled_clip` too, that clip acts only then (an update of on-policy steps needs none). Off (on Lift from state
    it did not give the synchronous trainer's learning back: docs/training.md)."""
    refresh_params: bool = True
    """With `overlap`: the workers take the parameters of each update as soon as it ends, from their next step on,
    so only the steps taken while the learner updated (and logged, checkpointed, evaluated) act with the parameters
    before it (metrics.csv's `lagged_share`); the rest of the rollout is on-policy. Which steps those are depends on
    timing, so such a run is not reproduced exactly. Off: each rollout acts wholly with the parameters it started
    with, one update behind (reproducible)."""
    max_lagged_share: float = setting(1.0, positive=True, maximum=1)
    """With `overlap` and `refresh_params`: the share of its rollout a worker may take during an update, with the
    parameters before it; there it waits for the update's. It bounds the lag where the update outlasts that share
    of the rollout (metrics.csv's `lagged_share`), at the cost of the time the workers wait (on HalfCheetah on 2
    cores, all the overlap's gain: docs/training.md); 1: they never wait."""
    early_start: bool = False
    """With `overlap`: a worker that has collected its share of the rollout in flight starts its share of the next
    at once, with the parameters published for it, instead of waiting for the slowest worker; its steps taken before
    the update ends lag as those taken during it (`lagged_share`, bounded by `max_lagged_share`). Needs
    `refresh_params`; not with `sync_fraction`. Off: each rollout starts once the last one has ended (the reference)."""
    pin_workers: bool = False
    """Pin each worker process to its drawing share of the CPUs this process may use (`env.env_threads`, else
    cores / workers, at least one; blocks in turn, a distributed rank's workers after those of the ranks before it,
    round the list again where they outnumber the CPUs), so the scheduler never moves a worker away from its caches;
    the learner stays free to run anywhere. Off: the scheduler places them (the reference). Linux only."""
    sync_fraction: float = setting(1.0, positive=True, maximum=1)
    """Share of the workers whose finished rollout ends everyone's: once that many are done, the others stop before
    their next step, keeping at least a quarter of theirs (DD-PPO's pre-emption of stragglers; it used 0.6). Their
    envs go on from there in the next rollout; GAE bootstraps each env from where it stopped, and the update
    learns from the steps taken (metrics.csv's `rollout_cut`: the share not taken). 1: wait for every worker (the
    reference). Below 1, with several workers, it must leave at least one to cut (one worker alone has none); not
    with distributed ranks that have workers, whose updates must agree on their size."""

    @property
    def rollout_buffers(self) -> int:
        """Shared rollout buffers: two with `overlap` (the workers fill one while the learner reads the other)."""
        return 2 if self.overlap else 1

    @property
    def workers_waited_for(self) -> int:
        """The workers whose finished rollouts end a rollout (all at 1)."""
        return share_waited_for(self.sync_fraction, self.num_workers)

    @property
    def lag(self) -> int:
        """The policy lag the workers collect at: `policy_lag` with `overlap`, else 0."""
        return self.policy_lag if self.overlap else 0


@dataclass
class ModelConfig:
    kind: str = setting("auto", choices=("auto", "impala", "nature", "spatial", "mlp", "random"), resume=True)
    """Network: `impala` (image observations), `nature` (the Nature DQN CNN, as the Atari references use), `mlp`
    (vector observations), `auto` to pick by shape (impala for images), or `random` (uniform actions, no network:
    for measuring raw env throughput). A dict observation's image keys are read by the IMPALA CNN (`auto`,
    `impala`) or the Nature CNN (`nature`, as Stable-Baselines3's MultiInputPolicy does). Every network has a
    categorical head for discrete actions and a diagonal Gaussian with a state-independent log-std for continuous
    ones. `spatial` reads a dict's image keys with a small CNN ending in a spatial softmax (keypoints: where things
    are in the frame, for manipulation)."""
    impala_depths: list[int] = setting([16, 32, 32], widths=True, resume=True)
    """Channels of the IMPALA CNN's three stages."""
    keypoints: int = setting(32, positive=True, maximum=1024, resume=True)
    """Keypoints of `kind: spatial`'s spatial softmax (each an x and a y)."""
    hidden_size: int = setting(256, positive=True, maximum=65536, resume=True)
    """Width of the dense layer over a CNN's features (each head's own where actor and critic have one each)."""
    init: str = setting("reference", choices=("reference", "orthogonal"), resume=True)
    """Weights of the IMPALA CNN, and of a dict observation's CNNs (IMPALA or Nature) and dense layer (the Nature
    CNN over a single image is always orthogonal, as CleanRL's ppo_atari): `reference` (PyTorch's default init for
    the convolutions and the dense layer, orthogonal heads with gain 0.01 for the actor and 1 for the critic, as
    CleanRL's ppo_procgen) or `orthogonal` (gain √2 on every layer: activations grow from stage to stage on Procgen
    frames, so the first value estimates are large, which value clipping then undoes only `clip_coef` per update)."""
    mlp_hidden: list[int] = setting([64, 64], widths=True, resume=True)
    """Hidden layer widths of the MLP (separate actor and critic towers)."""
    actor_keys: list[str] = setting([], names=True, resume=True)
    """Keys of a dict observation the policy reads (empty: every key), e.g. what a real robot has: its wrist camera
    and proprioception. `predict`, `eval`, `demo` and an exported file need only these."""
    critic_keys: list[str] = setting([], names=True, resume=True)
    """Keys of a dict observation the value function reads (empty: every key): privileged ones that only a simulator
    has, such as robosuite's `object-state` (an asymmetric actor-critic, Pinto et al. 2017), with or without the
    actor's. The privileged keys are collected and normalized as any other, but never reach the policy."""
    share_encoder: bool = setting(True, resume=True)
    """Actor and critic read each image key both read through one CNN, trained by both losses; false gives each its
    own CNNs (twice the image work). Where both read the same keys and share, the network is the single multi-input
    one. An image key only the actor reads has the actor's own CNN either way."""


@dataclass
class TrainingConfig:
    n_steps: int = setting(128, positive=True, maximum=100_000)
    """Steps per env per rollout."""
    batch_size: int = setting(256, positive=True, command_line=True)
    """SGD minibatch size; must divide n_steps × total envs."""
    microbatch_size: int | str = setting("auto", non_negative=True, auto=True)
    """Samples per forward/backward pass inside a minibatch (0 = the whole minibatch), or `auto`: 64 unless 128 or
    the whole minibatch is clearly faster, measured on this machine before the run (`learner_settings`); the whole
    minibatch, unmeasured, on a GPU and for a network too small for the choice to matter (CartPole's MLP).
    Gradients add up to the minibatch's, so this trades nothing but memory and cache misses."""
    n_epochs: int = setting(3, positive=True)
    """Passes over each rollout."""
    learning_rate: float = setting(5e-4, positive=True)
    """Adam learning rate (Adam eps is 1e-5)."""
    anneal_lr: bool = False
    """Linearly anneal the learning rate to 0 over the run: over `run.total_steps` where set, else the duration."""
    anneal_steps: int = setting(0, non_negative=True)
    """With `anneal_lr`: anneal over this many env steps instead, wherever the run stops (0 = over the run): a
    1M-step run on a reference's 10M-step schedule, to compare with its curve at 1M. Not below `run.total_steps`."""
    gamma: float = setting(0.999, unit_interval=True)
    """Discount factor."""
    gae_lambda: float = setting(0.95, unit_interval=True)
    """GAE lambda."""
    clip_coef: float = setting(0.2, positive=True)
    """PPO ratio clip range."""
    clip_vloss: bool = True
    """Clip the value loss around the old values (by ±clip_coef)."""
    normalize_reward: bool = False
    """Divide rewards by a running std of the discounted return, as the reference Procgen PPOs do (episode
    returns in metrics and reports stay raw)."""
    reward_clip: float = setting(10.0, positive=True)
    """Clip normalized rewards to ±this (only with normalize_reward)."""
    sign_rewards: bool = False
    """Learn from each reward's sign (−1, 0 or 1), as the Atari references clip rewards (metrics stay raw)."""
    normalize_obs: bool = setting(False, resume=True)
    """Normalize vector observations by a running mean and variance over every observation of every rollout,
    clipped to ±obs_clip. The statistics are part of the policy: updated by the learner after each update from
    the whole rollout (all ranks'), published to workers with the parameters, saved in the checkpoint and used by
    eval, demo and `predict`."""
    obs_clip: float = setting(10.0, positive=True, resume=True)
    """Clip normalized observations to ±this (only with normalize_obs)."""
    ent_coef: float = setting(0.01, non_negative=True)
    """Entropy bonus coefficient."""
    vf_coef: float = setting(0.5, non_negative=True)
    """Value loss coefficient."""
    max_grad_norm: float = setting(0.5, positive=True)
    """Global gradient norm clip."""
    augment_shift: int = setting(0, non_negative=True, maximum=64)
    """Random shift of image observations in the update (DrQ, RAD): each frame of a minibatch moved by up to this
    many pixels in each direction, the edge pixels repeated (pad and random crop), drawn from a stream seeded by
    `run.seed` and the update's number; 0 is off. Frames are shifted only where the loss reads them: collection,
    the normalizer and the policy's actions see them as the env gave them."""
    augment_keys: list[str] = setting([], names=True)
    """The image keys of a dict observation that `augment_shift` moves (empty: every image key)."""
    augment_regularizer: float = setting(0.0, non_negative=True)
    """Where the shifted frames go. 0: into the PPO loss itself (RAD, DrQ), whose ratio then compares the policy
    on shifted frames with the log-probabilities stored for the frames as collected, so it starts off 1. Above 0:
    the loss reads the frames as collected, and the shifted ones enter only a regularizer of this weight, how far
    the shift moves the policy (KL) and the value (half the squared difference) from theirs on the frames as
    collected (DrAC, Raileanu et al. 2021, which used 0.1); one more forward and backward pass a minibatch, about
    twice the update's network work."""
    predict_privileged: float = setting(0.0, non_negative=True)
    """Weight of an auxiliary loss beside PPO's: the actor's features predict, through a linear layer of their own,
    the vector keys that only the critic reads (`model.critic_keys`, such as robosuite's `object-state`), as the
    critic reads them (normalized with `normalize_obs`; mean squared error, `losses/privileged_prediction`). With a
    privileged critic, the value loss needs no frame to find the object; this loss has the actor's encoder learn
    what the privileged keys hold from what the actor sees. The policy acts as without it (an exported file carries
    the unused layer). Its weight may change on resume, not whether it is 0. 0: none (the layer is not built)."""
    augment_anchor: bool = False
    """With `augment_shift` in the loss: PPO's ratio on the shifted frames is taken against the policy the update
    started from on the same shifted frames (one more forward pass a minibatch, without backward), so it starts
    at 1, and each sample is weighed by that policy's probability of its action on the shifted frames over the one
    it was collected with: Hilton et al. 2022's decoupled objective, the shifted frames' policy as its proximal
    one. The value loss then clips around that policy's values on the same frames, approx_kl and clipfrac (and
    `target_kl`) measure the update's own move from it, and with a policy lag (`parallel.overlap`) the weight
    corrects for it too. Off: the ratio compares the shifted frames with the stored log-probabilities (RAD, DrQ)."""
    norm_adv: bool = True
    """Normalize advantages per minibatch."""
    target_kl: float = setting(0.0, non_negative=True)
    """Stop the epochs early, after an epoch whose approx KL, the mean over its minibatches (and over the ranks of
    a distributed run), exceeds this (0 = never). CleanRL checks the last minibatch's KL instead."""
    precision: str = setting("auto", choices=("auto", "fp32", "bf16", "tf32"))
    """Network arithmetic: fp32, bf16 (autocast; log-probs, losses and optimizer state stay fp32), tf32 (fp32
    tensors whose matrix products and convolutions a CUDA GPU computes in TF32; an NVIDIA GPU of compute capability
    8.0 or later only), or `auto`: fp32 unless bf16 (or, on such a GPU, tf32) is clearly faster for this network on
    this machine, measured before the run (`learner_settings`); fp32, unmeasured, on a CPU without native bf16 or
    for a network too small to matter. bf16 is much faster on a CPU with native bf16, slower without."""
    device: str = setting("auto", command_line=True)
    """Where the learner runs (`--device`): any torch device (`cpu`, `cuda`, `cuda:1`, `xpu`, `mps`, DirectML's
    `privateuseone:0`), or `auto`: CUDA (ROCm builds answer as CUDA), else XPU, else MPS, else DirectML's device
    when `torch_directml` is installed, else the CPU. Parallel workers always run on the CPU and read the parameters
    from CPU shared memory."""


@dataclass
class RunConfig:
    duration: float = setting(1.0, positive=True, maximum=24 * 365, unit="h", command_line=True)
    """Wall-clock budget in hours; the run stops at the first update boundary after it."""
    total_steps: int = setting(0, non_negative=True, command_line=True)
    """Stop after this many env steps (0 = no step limit)."""
    seed: int = setting(1, non_negative=True, maximum=2**31 - 1, command_line=True)
    """Seed for torch, action sampling and envs."""
    output_dir: str = setting("", command_line=True)
    """Run directory (empty = benchmarks/<mode>_<timestamp>)."""
    checkpoint_interval: float = setting(300.0, positive=True, maximum=10**9, unit="s")
    """Seconds between checkpoints (one is always written at the end)."""
    limit_seconds: float = setting(10.0, non_negative=True, maximum=3600, unit="s")
    """Seconds each measurement before training takes: the `auto` learner settings and threads, and the compute
    limit summary.json reports the run's efficiency against (0 = skip them all, `auto` taking its defaults)."""
    preempt_signal: str = setting("SIGUSR1", choices=("", "SIGUSR1", "SIGUSR2"))
    """The signal a scheduler sends before it stops a job (Slurm: `--signal=USR1@90`); empty: none."""
    on_preempt: str = setting("stop", choices=("stop", "checkpoint"))
    """What `preempt_signal` does at the next update boundary: `stop` (checkpoint, summary, exit 128 + signal, as
    SIGTERM does) or `checkpoint` (write a checkpoint and train on)."""


@dataclass
class EvalConfig:
    interval_seconds: float = setting(0.0, non_negative=True, maximum=10**9, unit="s")
    """Evaluate the policy every this many seconds of training, and once at the end (0 = never). It plays on
    fresh envs of its own, in the learner's process; its time is the `eval` phase of the update after it."""
    episodes: int = setting(16, positive=True, maximum=10**6)
    """Complete episodes per evaluation."""
    num_envs: int = setting(8, positive=True, maximum=4096)
    """Envs an evaluation plays at once (each plays its share of the episodes)."""
    levels: str = setting("auto", choices=("auto", "train", "test"))
    """`test`: Procgen levels the run never trains on; `train`: its own levels (or the gymnasium env itself);
    `auto`: test where the run has levels to hold out, else train."""
    deterministic: bool = False
    """Take the most likely action instead of sampling."""
    video: list[str] = setting([], names=True)
    """Views of env 0 that each evaluation records as a video in TensorBoard (tag `videos/eval`, an animated GIF
    under Images), side by side, left to right, as `demo --views` shows them: `env` (the env's own render, a
    third-person camera), `agent` (every image the policy observes, as it receives it: resized and stacked, the
    newest frame of a stack, never augmented; each image key of a dict observation, such as robosuite's wrist
    camera) or one image key by name. Empty, the default: no video, and no rendering for it."""
    video_frames: int = setting(300, positive=True, maximum=100_000)
    """Most frames of an evaluation's video (its first ones, shown at 15 frames/s); drawing and encoding them counts
    in the `eval` phase."""


@dataclass
class DistributedConfig:
    num_envs_total: int = setting(0, non_negative=True, maximum=2**20, command_line=True)
    """Envs over all ranks of a `--distributed` run, split evenly among them, and then `training.batch_size` is the
    minibatch of all ranks, split too: one global problem shared out (strong scaling). 0, the default: each rank
    runs the env layout and the minibatch given for one process, and the global figures are those × the ranks
    (the scaling rule that keeps each rank's work the same at any rank count)."""
    timeout_seconds: float = setting(45.0, positive=True, maximum=7 * 24 * 3600, unit="s")
    """How long a rank waits on the others in one exchange before it gives up (a rank that hung): with the update
    in progress, under a minute. A rank that died is noticed at once. (The wait for rank 0's logging, checkpoints
    and evaluation after an update has a timeout of an hour.)"""
    sync_fraction: float = setting(1.0, positive=True, maximum=1)
    """Share of the ranks whose finished rollout ends everyone's: once that many are done, the others stop before
    their next step, keeping at least a quarter of theirs (DD-PPO's pre-emption of stragglers; it used 0.6), as
    `parallel.sync_fraction` does for workers. Sequential ranks only, and where the quarter kept fills a rank's
    minibatches (the ranks' all-reduces must agree on their count); 1: every rank steps its whole rollout."""


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    """Write TensorBoard events under <output_dir>/logs."""
    progress: str = setting("auto", choices=("auto", "on", "off"))
    """Progress of a run while it trains (rank 0 only): `auto` shows a tqdm bar when stdout is a terminal and
    otherwise (a batch job's log: nohup, Slurm, CI) a plain line every `progress_seconds` through Python's logging
    (logger `parallel_ppo.progress`, level INFO: the command lines print it to stdout; in Python your logging setup
    decides); `on` also prints the lines to stdout itself where nothing handles that logger; `off` shows neither."""
    progress_seconds: float = setting(30.0, positive=True, maximum=10**9, unit="s")
    """Seconds between two progress lines when stdout is not a terminal (the first update is always logged)."""
    return_window: int = setting(100, positive=True, maximum=10**6)
    """Episodes in the rolling mean of returns and lengths."""
    episode_info: list[str] = setting([], names=True)
    """Numeric entries of an episode's final info (the info of the step that ended it) to log, e.g.
    `[distance_to_goal]`: each one's mean over the last `return_window` episodes whose info had it is the metric
    `episode/<key>` (metrics.csv `episode_<key>`, TensorBoard, summary.json's `final_metrics`, compare_results'
    table across seeds). An entry that is not a number stops the run. `is_success` is always logged, where an env
    reports it, as `charts/success_rate`."""


@dataclass
class TrackingConfig:
    wandb: bool = setting(False, command_line=True)
    """Track the run in Weights & Biases (`--track`; needs `pip install 'parallel_ppo[wandb]'`): the resolved config,
    each update's metrics, the summary, and the videos of `eval --video` and `demo` (those of `eval.video` go to
    TensorBoard only). `WANDB_MODE=offline`: no network, a folder a session in <output_dir>/wandb (or `WANDB_DIR`)."""
    project: str = setting("parallel_ppo", command_line=True)
    """W&B project (`--wandb-project`)."""
    entity: str = setting("", command_line=True)
    """W&B team or user (`--wandb-entity`; empty: your default entity)."""
    group: str = setting("", command_line=True)
    """W&B group of the run, e.g. one per experiment or per set of seeds (`--wandb-group`; empty: none)."""
    tags: list[str] = setting([], names=True, command_line=True)
    """W&B tags (`--wandb-tags a,b`; in YAML a list or a comma-separated string)."""


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    run: RunConfig = field(default_factory=RunConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    @property
    def rollout_size(self) -> int:
        """Env steps collected per update."""
        return self.training.n_steps * self.env.num_envs

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def config_fields() -> Iterator[tuple[str, dataclasses.Field]]:
    """`(section.key, field)` of every field of every section, in the order of a config file."""
    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(section.default_factory):
            yield f"{section.name}.{f.name}", f
