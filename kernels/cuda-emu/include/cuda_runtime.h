// Stand-in for CUDA's <cuda_runtime.h> in the CPU emulation: everything is in emu.h.
#include "emu.h"
