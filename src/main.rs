#[global_allocator]
static ALLOC: pathkernel::bench::CountingAlloc = pathkernel::bench::CountingAlloc;

fn main() {
    if lacks_build_cpu_features() {
        eprintln!("error: this binary was built for x86-64-v3 (AVX2 and FMA; .cargo/config.toml) and this CPU lacks them; rebuild it with RUSTFLAGS=\"\" cargo build --release");
        std::process::exit(2);
    }
    keep_freed_memory();
    std::process::exit(pathkernel::cli::main());
}

/// glibc's defaults hand every freed block at the top of a heap back to the kernel (and map
/// blocks over its moving threshold afresh), so the kernel engine's buffers of a few MB to a few
/// hundred MB were zero-faulted again at every use: a quarter of a LeNet-5 EPK's CPU time was
/// page faults. Here freed memory is kept and heaps grow 64 MiB at a time. The peak resident
/// memory it costs, measured: none on the 2 000-image LeNet-5 EPK (1.12 GB both ways), 7 % on
/// the MNIST MLP's 2 000 × 2 000 EPK (1 833 against 1 716 MiB, the same time), 11–12 % on the whole
/// `mnist-mlp` study (2 463–2 477 against 2 220 MiB).
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
/// them such a binary would stop at its first vector instruction with SIGILL. Asked of CPUID
/// itself (`is_x86_feature_detected!` answers "yes" for every feature the build enables), first
/// thing in `main`, with integer instructions only; the message is a constant (no allocation,
/// the standard library's printing is its prebuilt baseline build). Tested under
/// `qemu-x86_64 -cpu Nehalem` (one line, status 2) and `-cpu Haswell` (runs).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
#[inline(never)]
fn lacks_build_cpu_features() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is read only where leaf 0 says it exists;
    // XGETBV only where CPUID's OSXSAVE bit says the OS enabled it.
    unsafe {
        if __cpuid(0).eax < 7 {
            return true;
        }
        let (l1, l7) = (__cpuid(1), __cpuid_count(7, 0));
        let fma = l1.ecx & (1 << 12) != 0;
        let osxsave = l1.ecx & (1 << 27) != 0;
        let avx2 = l7.ebx & (1 << 5) != 0;
        // The OS saves the YMM registers (XCR0 bits 1 and 2).
        !(fma && avx2 && osxsave && _xgetbv(0) & 0b110 == 0b110)
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
fn lacks_build_cpu_features() -> bool {
    false
}
