fn main() {
    std::process::exit(pathkernel::cli::main());
}
