// Stand-in for CUDA's <cuda_bf16.h> in the CPU emulation: everything is in emu.h.
#include "emu.h"
