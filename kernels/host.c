/* The host build of the device kernels (build.rs): epk.cu as C, each kernel a plain loop. */
#include "epk.cu"
