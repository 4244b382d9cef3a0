/* Links against mha::mha and runs one call: one query over two keys whose
   scores tie, so the output is the mean of the two values. */
#include <stdio.h>

#include <mha.h>

int main(void)
{
    const float q[2] = {1, 0}, k[4] = {1, 0, 1, 0}, v[4] = {1, 2, 3, 4};
    float out[2];
    const mha_attn_dims dims = {.batch = 1, .heads = 1, .kv_heads = 1, .seq_q = 1, .seq_kv = 2,
                                .head_dim = 2};
    const mha_status st = mha_attention(&dims, q, k, v, 1.0f, NULL, out, MHA_LAYOUT_BHSD);
    printf("libmha %s on %s: %s, out = %g %g\n", mha_version(), mha_isa_name(mha_isa_active()),
           mha_status_str(st), out[0], out[1]);
    return st == MHA_OK && out[0] == 2 && out[1] == 3 ? 0 : 1;
}
