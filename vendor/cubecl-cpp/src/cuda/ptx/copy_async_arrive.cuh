// Wrapper for https://docs.nvidia.com/cuda/parallel-thread-execution/#parallel-synchronization-and-communication-instructions-cp-async-mbarrier-arrive
inline __device__ void
__cp_async_arrive(::cuda::barrier<::cuda::thread_scope_block> &__bar) {
  uint64 *mbar_ptr = ::cuda::device::barrier_native_handle(__bar);

  uint32 smem_int_mbar =
      static_cast<uint32>(__cvta_generic_to_shared(mbar_ptr));
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n"
               :: "r"(smem_int_mbar));
}

