#[global_allocator]
static ALLOC: pathkernel::bench::CountingAlloc = pathkernel::bench::CountingAlloc;

fn main() {
    if let Some(msg) = missing_cpu_features() {
        eprintln!("error: {msg}");
        std::process::exit(2);
    }
    keep_freed_memory();
    std::process::exit(pathkernel::cli::main());
}

/// glibc's defaults hand every freed block at the top of a heap back to the kernel (and map
/// blocks over its moving threshold afresh), so the kernel engine's buffers of a few MB to a few
/// hundred MB were zero-faulted again at every use: a quarter of a LeNet-5 EPK's CPU time was
/// page faults. Here freed memory is kept and heaps grow 64 MiB at a time (the peak resident
/// memory is unchanged: measured 1.12 GB both ways on the 2 000-image LeNet-5 EPK).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: mallopt only changes allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

/// `.cargo/config.toml` builds x86-64 binaries for x86-64-v3 (AVX2 and FMA); on a CPU without
/// them such a binary would stop at its first vector instruction with SIGILL. Checked first
/// thing in `main` (the standard library's start-up code is the prebuilt baseline build's).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
fn missing_cpu_features() -> Option<String> {
    let missing: Vec<&str> = [("avx2", is_x86_feature_detected!("avx2")), ("fma", is_x86_feature_detected!("fma"))]
        .into_iter()
        .filter_map(|(name, has)| (!has).then_some(name))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "this binary was built for x86-64-v3 (.cargo/config.toml) and this CPU lacks {}; rebuild it with RUSTFLAGS=\"\" cargo build --release",
            missing.join(" and ")
        )
    })
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
fn missing_cpu_features() -> Option<String> {
    None
}
