#[global_allocator]
static ALLOC: pathkernel::bench::CountingAlloc = pathkernel::bench::CountingAlloc;

fn main() {
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
