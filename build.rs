//! Compiles the device kernels of the node evaluation (kernels/epk.cu) for the host, as C, into
//! a static library the `device` module's host backend calls. The same source is compiled to
//! PTX by NVRTC for a GPU (scripts/gpu/ptx.py). Floating-point contraction is off on both sides
//! (`-ffp-contract=off` here, `--fmad=false` there) so that the two round alike.
fn main() {
    println!("cargo:rerun-if-changed=kernels/epk.cu");
    println!("cargo:rerun-if-changed=kernels/host.c");
    cc::Build::new().file("kernels/host.c").flag("-ffp-contract=off").flag_if_supported("-std=c99").warnings(true).extra_warnings(true).warnings_into_errors(true).compile("pathkernel_kernels");
}
