/**
 * The Attention rewrite (src/gpu-worker/attention-fusion.ts): on tiny-embed,
 * after the LayerNorm one as the server applies them, every self-attention
 * becomes one Attention node and the token states equal the unmodified
 * graph's (plain onnxruntime runs of both, right-padded random batches, seed
 * printed); a graph that strays from the pattern in one place keeps that
 * layer as it is.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { fuseAttention } from '../dist/src/gpu-worker/attention-fusion.js';
import { fuseSkipLayerNorm } from '../dist/src/gpu-worker/fusion.js';
import { decodeModel, encodeModel, onnx } from '../dist/src/shared/model-format/onnx-graph.js';
import { expectSameTokenStates, modelsDir } from './helpers.js';

const TINY_EMBED = readFileSync(join(modelsDir, 'tiny-embed', 'model.onnx'));
const LAYERS = 2;
const opTypes = (m: onnx.IModelProto) => (m.graph!.node ?? []).map((n) => n.opType);
const count = (m: onnx.IModelProto, op: string) => opTypes(m).filter((t) => t === op).length;

/** tiny-embed with `change` applied to its decoded graph (node names as the exporter wrote them). */
function changed(change: (g: onnx.IGraphProto, node: (name: string) => onnx.INodeProto, setScalar: (name: string, v: number) => void) => void): onnx.IModelProto {
  const model = decodeModel(TINY_EMBED);
  const g = model.graph!;
  const node = (name: string) => g.node!.find((n) => n.name === name)!;
  const setScalar = (name: string, v: number) => {
    const t = g.initializer!.find((i) => i.name === name)!;
    t.rawData = new Uint8Array(Float32Array.of(v).buffer);
    t.floatData = [];
  };
  change(g, node, setScalar);
  return model;
}

describe('fuseAttention on a BERT export', () => {
  it("rewrites tiny-embed's two self-attentions into Attention nodes; its token states equal the unmodified graph's on padded batches", async () => {
    const model = decodeModel(TINY_EMBED);
    expect(fuseSkipLayerNorm(model)).toBe(5);
    expect(fuseAttention(model)).toBe(LAYERS);
    expect(count(model, 'Attention')).toBe(LAYERS);
    for (const gone of ['Softmax', 'Transpose', 'Reshape', 'Sub']) expect(count(model, gone), gone).toBe(0); // the extended mask (Sub) went with the last layer
    // The FFN's two MatMuls and the attention's output projection stay; the six head projections and two products per layer go.
    expect(count(model, 'MatMul')).toBe(3 * LAYERS);
    // So do the separate weights: only the concatenated ones are left to hand onnxruntime.
    const weights = (model.graph!.initializer ?? []).map((t) => t.name!);
    expect(weights.filter((n) => /attention\.self\.(query|key|value)\./.test(n))).toEqual([]);
    expect(weights.filter((n) => n.endsWith('/qkv_weight'))).toHaveLength(LAYERS);
    await expectSameTokenStates(TINY_EMBED, encodeModel(model), 'attention fusion tiny-embed');
  });
});

describe('fuseAttention: what it leaves', () => {
  const layer0 = '/encoder/layer.0/attention/self/';
  const cases: [string, number, Parameters<typeof changed>[0]][] = [
    // Attention scales by 1/sqrt(d): a graph that scales otherwise computes something else.
    [
      'a layer whose scores are scaled by other than 1/sqrt(head size)',
      LAYERS - 1,
      (g, node) => {
        g.initializer!.push({ name: 'by-seven', dataType: onnx.TensorProto.DataType.FLOAT, dims: [], rawData: new Uint8Array(Float32Array.of(7).buffer) });
        node(`${layer0}Div`).input![1] = 'by-seven'; // its own constant: the layers share the exporter's
      },
    ],
    ['a layer whose attention probabilities are also a graph output', LAYERS - 1, (g, node) => void g.output!.push({ name: node(`${layer0}Softmax`).output![0]! })],
    ['a layer whose keys come from another tensor than its queries', LAYERS - 1, (_g, node) => void (node(`${layer0}MatMul_1`).input![0] = node('/embeddings/Add_1').output![0]!)],
    // (1 - mask) * fill is the extended mask Attention computes; (2 - mask) * fill is not.
    ['a graph whose extended mask is not (1 - mask) * fill', 0, (_g, node, setScalar) => setScalar(node('/extended_attention_mask/Sub').input![0]!, 2)],
    ['a graph whose mask comes from another input than attention_mask', 0, (_g, node) => void (node('/extended_attention_mask/Unsqueeze').input![0] = 'token_type_ids')],
  ];
  for (const [what, fused, change] of cases) {
    it(`leaves ${what} as it is (${fused} of ${LAYERS} fused)`, () => {
      const model = changed(change);
      expect(fuseAttention(model)).toBe(fused);
      expect(count(model, 'Attention')).toBe(fused);
      expect(count(model, 'Softmax')).toBe(LAYERS - fused);
    });
  }

  it('reads scalars and shapes from Constant nodes as from initializers (torch.onnx writes both)', async () => {
    const model = changed((g, node) => {
      // Layer 0's scale and its query's reshape shape as Constant nodes of their own.
      for (const [consumer, at] of [[`${layer0}Div`, 1], [`${layer0}Reshape`, 1]] as const) {
        const n = node(consumer);
        const value = g.initializer!.find((t) => t.name === n.input![at])!;
        const name = `${consumer}/as-constant`;
        g.node!.unshift({ opType: 'Constant', name, output: [name], attribute: [{ name: 'value', type: onnx.AttributeProto.AttributeType.TENSOR, t: { ...value, name } }] });
        n.input![at] = name;
      }
    });
    const exported = encodeModel(model);
    expect(fuseAttention(model)).toBe(LAYERS);
    expect(count(model, 'Constant')).toBe(0); // went with the nodes that read them
    await expectSameTokenStates(exported, encodeModel(model), 'attention fusion with Constant nodes');
  });

  it('keeps what a subgraph reads from the outer graph: an If whose branches copy the extended mask out', async () => {
    const mask = '/extended_attention_mask/Mul_output_0';
    const branch = (name: string): onnx.IGraphProto => ({
      name,
      node: [{ opType: 'Identity', input: [mask], output: [`${name}_out`], name: `${name}/copy` }],
      output: [{ name: `${name}_out`, type: { tensorType: { elemType: onnx.TensorProto.DataType.FLOAT } } }],
    });
    const model = changed((g) => {
      g.initializer!.push({ name: 'yes', dataType: onnx.TensorProto.DataType.BOOL, dims: [], int32Data: [1] });
      g.node!.push({
        opType: 'If',
        name: 'copy-mask',
        input: ['yes'],
        output: ['mask_copy'],
        attribute: [
          { name: 'then_branch', type: onnx.AttributeProto.AttributeType.GRAPH, g: branch('then') },
          { name: 'else_branch', type: onnx.AttributeProto.AttributeType.GRAPH, g: branch('else') },
        ],
      });
      g.output!.push({ name: 'mask_copy', type: { tensorType: { elemType: onnx.TensorProto.DataType.FLOAT } } });
    });
    const exported = encodeModel(model);
    expect(fuseAttention(model)).toBe(LAYERS);
    expect(model.graph!.node!.some((n) => n.output!.includes(mask))).toBe(true); // the If still reads it
    await expectSameTokenStates(exported, encodeModel(model), 'attention fusion with a subgraph');
  });

  it('leaves a graph without an attention_mask input as it is', () => {
    const model = changed((g) => void (g.input = g.input!.filter((i) => i.name !== 'attention_mask')));
    const before = encodeModel(model);
    expect(fuseAttention(model)).toBe(0);
    expect(Buffer.compare(encodeModel(model), before)).toBe(0); // not a byte changed
  });
});
