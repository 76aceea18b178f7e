//! PyTorch interoperability at the level of runs: a recorded state exported as a PyTorch
//! `state_dict`, and a trajectory recorded by a PyTorch training loop imported as a run.
//!
//! The parameter names and the export's conventions (α folded into the last layer, the
//! `init.` tensors of `zero_output`) are in [`crate::model::torch`]; `scripts/torch_model.py`
//! rebuilds the module from an exported file.

use std::path::Path;

use crate::error::{Error, Result};
use crate::model::torch::{self, ExportSource};
use crate::trajectory::Run;

/// A network exported from a run.
#[derive(Clone, Debug)]
pub struct Exported {
    /// The safetensors bytes ([`torch::export_bytes`]).
    pub bytes: Vec<u8>,
    /// The state exported.
    pub step: usize,
    /// The last state N of the run.
    pub steps: usize,
    /// The module, as PyTorch prints it.
    pub module: String,
    /// Whether the file carries the `init.` network (`zero_output`).
    pub zero_output: bool,
    /// The α folded into the last layer.
    pub alpha: f64,
}

impl std::fmt::Display for Exported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exported state {} of {}: {}", self.step, self.steps, self.module)?;
        if self.alpha != 1.0 {
            write!(f, ", alpha {} folded into the last layer", self.alpha)?;
        }
        if self.zero_output {
            f.write_str(", zero_output: output = net(x) - init(x) (init.* tensors)")?;
        }
        Ok(())
    }
}

/// The network at state `step` (default: the last, N) of `run` as a PyTorch `state_dict` whose
/// module output is the network's logits.
///
/// Errors: `step` beyond N.
pub fn export_torch(run: &Run, step: Option<usize>) -> Result<Exported> {
    let n = run.manifest.steps;
    let s = step.unwrap_or(n);
    if s > n {
        return Err(Error::Config(format!("--step {s} is beyond the last state {n} of {}", run.dir.display())));
    }
    let arch = &run.manifest.architecture;
    let params = run.load_step(s)?;
    let init = if arch.zero_output { Some(run.load_step(0)?) } else { None };
    let source = ExportSource { run: run.dir.display().to_string(), run_id: run.manifest.run_id.clone(), step: s };
    let bytes = torch::export_bytes(arch, &params, init.as_ref(), &source)?;
    Ok(Exported { bytes, step: s, steps: n, module: torch::module_description(arch), zero_output: arch.zero_output, alpha: arch.alpha })
}

/// Writes [`export_torch`]'s file to `out` atomically (temporary name, then rename).
pub fn export_torch_to(run_dir: &Path, step: Option<usize>, out: &Path) -> Result<Exported> {
    let run = Run::open(run_dir)?;
    let e = export_torch(&run, step)?;
    crate::io::write_atomic(out, &e.bytes)?;
    Ok(e)
}
