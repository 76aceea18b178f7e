#[global_allocator]
static ALLOC: pathkernel::bench::CountingAlloc = pathkernel::bench::CountingAlloc;

fn main() {
    std::process::exit(pathkernel::cli::main());
}
