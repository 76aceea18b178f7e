//! Fuzzes the TOML parsers: `StudyConfig::from_toml` (study files) and `RunConfig::from_toml`
//! (`pathkernel train --config`). Neither may panic. For an accepted configuration the harness
//! also does what `train`/`study run` do next without touching data: the run id, each
//! `[[kernel]]` entry's request and label, and resolving the model for the input size, image
//! shape and output count the `[data]` section implies (`train::resolve`), then its parameter
//! list.
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use pathkernel::data::DataConfig;
use pathkernel::model::net::LossKind;
use pathkernel::model::{OutputKind, Params};
use pathkernel::study::StudyConfig;
use pathkernel::train::RunConfig;

#[path = "common.rs"]
mod common;

/// `(dim, image_shape, outputs, classification)` of the dataset `cfg` describes (`None` for the
/// file-backed kinds, whose shapes are only known from their files).
fn data_shape(cfg: &DataConfig) -> Option<(usize, Option<[usize; 3]>, usize, bool)> {
    Some(match cfg {
        DataConfig::GaussianMixture { dim, .. } => (*dim, None, 3, true),
        DataConfig::Linear2d { .. } => (2, None, 2, true),
        DataConfig::Regression1d { .. } => (1, None, 1, false),
        DataConfig::Mnist { .. } => (784, Some([1, 28, 28]), 10, true),
        DataConfig::Table(_) | DataConfig::Arrays(_) | DataConfig::Idx(_) => return None,
    })
}

fn after_parse(rc: &RunConfig) {
    let _ = rc.run_id();
    let Some((dim, image, outputs, classification)) = data_shape(&rc.data) else { return };
    let loss = rc.train.loss.unwrap_or(if classification { LossKind::CrossEntropy } else { LossKind::Mse });
    let output = match loss {
        LossKind::CrossEntropy => OutputKind::LogSoftmax,
        LossKind::Mse => OutputKind::Identity,
    };
    if let Ok(arch) = rc.model.resolve(dim, image, outputs, output) {
        let specs = arch.param_specs();
        let _ = Params { specs, data: Vec::new() }.numel();
        let _ = arch.outputs();
        let _ = arch.input_dim();
    }
}

fuzz_target!(|data: &[u8]| {
    common::guarded(|| one(data));
});

fn one(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let origin = Path::new("fuzz.toml");
    if let Ok(study) = StudyConfig::from_toml(text, origin) {
        for k in &study.kernels {
            let _ = k.request();
            let _ = k.label();
        }
        after_parse(&study.run_config());
    }
    if let Ok(rc) = RunConfig::from_toml(text, origin) {
        after_parse(&rc);
    }
}
