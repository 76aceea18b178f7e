//! Terminal progress bars for long loops (training, kernels).
//!
//! With the `cli` feature (the default) a [`Progress`] is an `indicatif` bar drawn on stderr.
//! Without it — the library a notebook depends on — it is a no-op with the same methods, so that
//! the library does not compile the application's terminal dependencies.

#[cfg(feature = "cli")]
use std::io::IsTerminal;

/// A progress bar on stderr, drawn only when asked for and stderr is a terminal.
pub struct Progress {
    #[cfg(feature = "cli")]
    bar: indicatif::ProgressBar,
}

impl Progress {
    /// A bar of initial length `len`, drawn with the `indicatif` template `template` (e.g.
    /// `"train {bar:40} {pos}/{len} steps"`) when `enabled` and stderr is a terminal, hidden
    /// otherwise (and always hidden without the `cli` feature).
    ///
    /// # Panics
    /// With the `cli` feature, when `template` is not a valid `indicatif` template (a programmer
    /// error: templates are literals).
    #[cfg_attr(not(feature = "cli"), allow(unused_variables))]
    pub fn new(enabled: bool, len: u64, template: &str) -> Self {
        #[cfg(feature = "cli")]
        {
            let bar = if enabled && std::io::stderr().is_terminal() {
                let b = indicatif::ProgressBar::new(len);
                b.set_style(indicatif::ProgressStyle::with_template(template).expect("valid progress template"));
                b
            } else {
                indicatif::ProgressBar::hidden()
            };
            Progress { bar }
        }
        #[cfg(not(feature = "cli"))]
        Progress {}
    }

    /// Sets the total length.
    #[cfg_attr(not(feature = "cli"), allow(unused_variables))]
    pub(crate) fn set_length(&self, len: u64) {
        #[cfg(feature = "cli")]
        self.bar.set_length(len);
    }

    /// Sets the position.
    #[cfg_attr(not(feature = "cli"), allow(unused_variables))]
    pub(crate) fn set_position(&self, pos: u64) {
        #[cfg(feature = "cli")]
        self.bar.set_position(pos);
    }

    /// Advances the position by `delta`.
    #[cfg_attr(not(feature = "cli"), allow(unused_variables))]
    pub(crate) fn inc(&self, delta: u64) {
        #[cfg(feature = "cli")]
        self.bar.inc(delta);
    }

    /// Sets the `{msg}` part of the template.
    #[cfg_attr(not(feature = "cli"), allow(unused_variables))]
    pub(crate) fn set_message(&self, msg: String) {
        #[cfg(feature = "cli")]
        self.bar.set_message(msg);
    }

    /// Removes the bar from the terminal.
    pub(crate) fn finish_and_clear(&self) {
        #[cfg(feature = "cli")]
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::Progress;

    #[test]
    fn a_disabled_bar_accepts_every_call() {
        let p = Progress::new(false, 3, "x {bar:10} {pos}/{len} {msg}");
        p.set_length(5);
        p.set_position(1);
        p.inc(2);
        p.set_message("m".into());
        p.finish_and_clear();
    }
}
