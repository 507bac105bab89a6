/**
 * How a request's inputs longer than the model takes are handled
 * (docs/long-inputs.md): its own `long_inputs`, else its dialect's truncation
 * field, else the server's --long-inputs. `truncate: false` (and Jina's
 * `truncation: false`) means "never cut": a 413, or windows where the server
 * chunks.
 */
import type { ChunkPolicy } from '../core/inputs.js';
import type { LongInputs } from '../core/long-inputs.js';
import type { ServedModel } from '../core/served-model.js';
import type { EndpointContext } from './serving.js';

/** --max-input-tokens when not set: this many times the model's length. */
export const MAX_INPUT_LENGTHS = 8;

/** What the body said: `long_inputs`, and its dialect's truncation flag (null, undefined: not said). */
export interface LongSaid {
  long?: LongInputs | null | undefined;
  truncate?: boolean | null | undefined;
}

/** The mode of a request: see the header. `dialectDefault`: what the dialect does when nothing says (Cohere's routes cut). */
export function longInputsOf(ec: EndpointContext, said: LongSaid, dialectDefault?: LongInputs): LongInputs {
  if (said.long) return said.long;
  if (said.truncate === true) return 'truncate';
  const server = ec.limits.longInputs ?? (ec.limits.truncate ? 'truncate' : 'error');
  if (server === 'chunk') return 'chunk';
  if (said.truncate === false) return 'error';
  return dialectDefault ?? server;
}

/** The call's `truncate` and `chunk` for a mode (`maxWindows`: Cohere's max_chunks_per_doc). */
export function cutFor(ec: EndpointContext, model: ServedModel, mode: LongInputs, maxWindows?: number | null): { truncate: boolean; chunk?: ChunkPolicy } {
  if (mode !== 'chunk') return { truncate: mode === 'truncate' };
  const chunk: ChunkPolicy = {
    maxInputTokens: ec.limits.maxInputTokens ?? MAX_INPUT_LENGTHS * model.plan.maxLength,
    overlap: ec.limits.chunkOverlapTokens ?? 0,
    ...(maxWindows != null ? { maxWindows } : {}),
  };
  return { truncate: false, chunk };
}

/** {@link cutFor} of {@link longInputsOf}. */
export function cutOf(ec: EndpointContext, model: ServedModel, said: LongSaid, dialectDefault?: LongInputs, maxWindows?: number | null) {
  return cutFor(ec, model, longInputsOf(ec, said, dialectDefault), maxWindows);
}
