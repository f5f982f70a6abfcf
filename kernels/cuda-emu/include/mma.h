// Stand-in for CUDA's <mma.h> in the CPU emulation: everything is in emu.h.
#include "emu.h"
