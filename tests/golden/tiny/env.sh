export JAX_PLATFORMS='cpu'
export MXC_JOB_NAME='tiny'
