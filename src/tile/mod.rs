//! Tiles: one kernel job split into independent pieces (row blocks × column blocks × step
//! ranges), each computed by its own process (a Slurm array task, say), written atomically, and
//! merged in a fixed order.
//!
//! Row points are independent (`kernel::engine::blocked`); so are the training points, the Gram's
//! columns (`kernel::engine::columns`, `Request::columns`: each column block forms the training-side
//! factors of its own points only, and the kernel machine `Σ_i a_{i,s} K_s(x, x_i)` is a sum
//! over them); and for plain gradient steps so are the steps: `G = Σ_s K_s` and the machine's
//! change are sums over steps, so the steps `[A, B)` split into ranges `[A, A_1), [A_1, A_2), …`
//! whose kernels are computed apart (`Request::steps`) and summed.
//!
//! ```text
//! pathkernel kernel --run R --kind epk --tiles 8 --out OUT   # OUT/plan.json, nothing computed
//! pathkernel tile run OUT --index I                           # OUT/tiles/tile-00000I.safetensors
//! pathkernel tile merge OUT                                   # OUT/merged/ (as `kernel --out`)
//! pathkernel tile slurm OUT --submit --max-parallel 4         # both as Slurm jobs
//! ```
//!
//! # The split (`--tiles`)
//!
//! - `--tiles N`: N row blocks (at most one per row point). Rows come first because a row
//!   block costs nothing extra but the training-side factors of its steps (M forward/backward
//!   passes per step, small against the Gram contraction), while every step range holds a Gram
//!   over all its rows: S ranges multiply the tiles' total size and the merge's reading by S.
//!   Only when there are fewer row points than N (a handful of class means, say) does the
//!   remaining factor go to step ranges, `S = ⌈N / P⌉`, when the run admits them.
//! - `--tiles RxS`: R row blocks × S step ranges, explicitly; `--tiles RxCxS` adds C column
//!   blocks (training points), for any run and kernel. A column block repeats the rows' side
//!   (their quadrature nodes) and shrinks what scales with M: its Gram, the training factors,
//!   `a` and the loss gradients of the steps (`[N, M, K]` each, the part of a tile's memory that
//!   row blocks cannot shrink). The columns' tiles of plain gradient steps also store each
//!   step's predicted and actual change (`[S_t, P_t, K]` each) for the exactness check.
//! - Step ranges need a run whose steps are separable (`steps_separable`): plain GD/SGD,
//!   with or without weight decay (`KernelForm::Gradient`, `GradientWithDecay`), and a path
//!   kernel (not the NTK, one kernel at one state). Momentum and Adam carry state from step to
//!   step (`K_r` sums the future steps' features): `--tiles N` then gives row blocks only, and
//!   `RxS` or `RxCxS` with S > 1 is refused.
//! - Then the blocks grow until one tile's estimated peak (the engine's
//!   `kernel::engine::blocked::plan_columns` estimate for its rows and columns, with momentum's and
//!   Adam's recursion and replay, plus the states `w_0 … w_N` it loads) fits `--memory`: the
//!   column blocks while a tile of one row point does not fit, the row blocks otherwise. Blocks
//!   are made even: `block = ⌈P / R⌉`, `R = ⌈P / block⌉` (columns likewise). Step ranges are
//!   even in length: `A + ⌊j (B − A) / S⌋`.
//! - Tile `i = (b·C + c)·S + r` is row block b against column block c over step range r.
//!
//! # `OUT/plan.json` ([`Plan`])
//!
//! The request (kind, quadrature, side, NTK step, per-step, steps, layout, points and a CRC-32
//! of the row points), the run directory (absolute) and run id, the shape P, M, K, N, the kernel
//! form, the split (R, rows per block, C, training points per block, the S step ranges, how
//! they were chosen), the budget, and per tile its index, row block, column block, step range,
//! rows `[lo, hi)`, columns `[lo, hi)`, steps `[lo, hi)`, file, bytes, estimated peak memory and
//! estimated seconds. The estimated seconds come from a pilot
//! timed while planning (one and up to 8 rows, one step at the start, middle and end of the
//! range: `seconds/step = fixed + rows · per_row`): rough, since the auto rule's cost varies by
//! step and point. The **plan id** is FNV-1a of the canonical JSON of the request, run id,
//! shape, form, pathkernel version and the tiles' ranges; planning the same job again gives the
//! same id, and planning it into a directory that already holds it leaves the directory and its
//! tiles as they are (without `--force`). An edited `plan.json` no longer matches its id and is
//! refused.
//!
//! # Tile files (`OUT/tiles/tile-IIIIII.safetensors`)
//!
//! A safetensors file (readable by `safetensors.numpy.load_file`). Metadata: `format`
//! (`pathkernel-tile`), `version` (2), `plan_id`, `run_id`, `index`, `row_lo`, `row_hi`,
//! `col_lo`, `col_hi`, `step_lo`, `step_hi`, `kind`, `quadrature`, `side`, `integrated`,
//! `layout`, `form`, `shape` (`P_t,M_t,K` of the tile), `a_step_lo` (with `a`), `machine`
//! (`share` or `whole`, with several column blocks: see `kernel::ColumnShare`) and **`crc32`**:
//! the CRC-32 (zlib's) of the whole data section, eight hex digits. Arrays, for the tile's `P_t`
//! rows, `M_t` columns and its steps:
//!
//! ```text
//! gram           [P_t, M_t, K, K] | [P_t, M_t, K] | [P_t, M_t]   Σ over the tile's steps (layout)
//! gram_steps     [S_t, P_t, …]  per-step Grams (--per-step)
//! diag           [P_t, K, K]    self-kernel over the tile's steps (ntk, dpk, epk)
//! bias           [P_t, K]       f at the range's first state
//! network        [P_t, K]       f at the range's last state
//! machine        [P_t, K]       bias + the range's kernel-machine change (+ reg, rounding;
//!                               plain steps with column blocks: the columns' share only)
//! single_machine [P_t, K]       (one step range and one column block only) Theorem 3.7's
//!                               machine
//! step_pred, step_actual [S_t, P_t, K]  (column blocks of plain steps) per step, the columns'
//!                               share of the predicted change, and the actual change (NTK:
//!                               [1, P_t, K], over the whole range)
//! reg, rounding  [P_t, K]       weight-decay and rounding terms over the range (non-plain runs)
//! decomposition_residual [1]    optimizer replay residual (non-plain runs)
//! a              [n_a, M_t, K]  a_{i,s} for steps a_step_lo … a_step_lo + n_a − 1
//!                               (row block 0's tiles only: a does not depend on the rows)
//! steps          [S_t] i64      the steps summed (NTK: [S])
//! seconds        [1]            the tile's compute seconds
//! records.*      [S_t]          per-step validation: step, max_abs_error, mean_abs_error,
//!                               max_abs_change, mean_evaluations, max_evaluations,
//!                               mean_jvp_evaluations, mean_pieces, unconverged_pieces,
//!                               dpk_cosine_error (the errors NaN in a share: see step_pred)
//! ```
//!
//! Tiles are written to a temporary file in `tiles/`, synced and renamed: a killed tile leaves
//! no `tile-*.safetensors` (at most a `.tile-….tmp-PID`, which nothing reads). Reading checks,
//! in order: the file's length against its header, the header, the CRC-32, the plan and run
//! ids, the index and ranges, the request, then every shape and dtype. `tile run` skips a tile
//! that passes, replaces one that is truncated or corrupted, and refuses (exit 2) to overwrite
//! a valid tile of another plan or run.
//!
//! # The merge (`OUT/merged/`)
//!
//! `tile merge` checks every tile first (present, header, plan, run; then each checksum as it
//! is read), then per row block and step range assembles the column blocks **in column order**
//! (`kernel::engine::columns::assemble`: Grams and `a` side by side; for plain steps the blocks'
//! `step_pred` summed per step, the machine re-summed from them in the one-process step order (equal to rounding) and the
//! per-step errors recomputed; momentum's and Adam's machine, computed whole in every block,
//! from block 0),
//! then sums the step ranges **in range order** (`g = g_0; g += g_1; …`):
//! gram, self-kernel, weight-decay and rounding terms summed; per-step Grams and records
//! concatenated; bias the first range's, network the last range's; machine
//! `machine_0 + Σ_{r≥1}(machine_r − bias_r)`; consecutive ranges must agree on f at the state
//! they share. The row blocks are then concatenated by `kernel::engine::blocked::in_blocks` (the
//! assembly of a blocked one-process run); `a` is the union of the tiles' (disjoint steps and
//! columns); with several step ranges or column blocks the single machine is recomputed from
//! the merged full Gram when `a` is constant over the steps. The result is written like `pathkernel kernel`'s
//! (`gram.safetensors`, `predictions.parquet`, `exactness.json` with `seconds` = the tiles'
//! seconds summed, `steps.parquet`), staged in `OUT/merged.partial` and moved into place. The
//! order is fixed, so reruns of a plan are bit-identical; against the one-process run the Gram
//! differs by the rounding of the range and column sums (≤ 1e-13 relative). The merge holds the merged
//! output in memory (as the one-process command does); to stream a Gram too large for that,
//! use [`TiledGram`] (a row block or a class block at a time) or read the tiles directly.
//!
//! # Python
//!
//! ```python
//! import json, struct, zlib
//! import numpy as np
//! from safetensors.numpy import load_file
//!
//! def read_tile(path):
//!     raw = open(path, "rb").read()
//!     n = struct.unpack("<Q", raw[:8])[0]
//!     meta = json.loads(raw[8:8 + n])["__metadata__"]
//!     assert zlib.crc32(raw[8 + n:]) == int(meta["crc32"], 16), f"{path}: corrupted"
//!     return meta, load_file(path)
//!
//! plan = json.load(open("OUT/plan.json"))
//! C, S = plan["col_blocks"], len(plan["step_ranges"])
//! for b in range(plan["row_blocks"]):          # one row block at a time
//!     blocks = []
//!     for c in range(C):                       # column blocks in order
//!         g = None
//!         for t in plan["tiles"][(b * C + c) * S:(b * C + c + 1) * S]:   # step ranges in order
//!             meta, arr = read_tile(f"OUT/{t['file']}")
//!             assert meta["plan_id"] == plan["plan_id"]
//!             g = arr["gram"] if g is None else g + arr["gram"]
//!         blocks.append(g)
//!     g = np.concatenate(blocks, axis=1)       # the Gram rows lo..hi against all M
//!     lo, hi = plan["tiles"][b * C * S]["rows"]
//! ```
//!
//! # Slurm
//!
//! `tile slurm OUT` writes `OUT/slurm/array.sbatch` (`#SBATCH --array=0-(N−1)%K`, each task
//! `pathkernel tile run OUT --index $SLURM_ARRAY_TASK_ID` with this binary's absolute path;
//! after a partial run only the tiles not yet complete) and `OUT/slurm/merge.sbatch`
//! (`pathkernel tile merge OUT`); with `--submit` both go to `sbatch --parsable`, the merge with
//! `--dependency=afterok:<array job>`; the ids are printed and kept in `OUT/slurm/jobs.json`.

mod compare;
mod crc;
mod exec;
mod format;
mod merge;
mod plan;
mod slurm;

pub use compare::{compare_dirs, ArrayDiff};
pub use exec::{run_tile, RunOutcome};
pub(crate) use exec::{tile_states, TileState};
pub use crc::crc32;
pub use format::{read_tile, tile_path, Tile, TileProblem};
pub use merge::{merge, merge_output, TiledGram};
pub(crate) use merge::merged_dir;
pub use plan::{make_plan, Pilot, Plan, PlanInput, PlanRequest, TileEntry, Tiling};
pub use slurm::{submit, SlurmScripts, Submitted};
pub(crate) use slurm::{write_scripts, SlurmOptions};
