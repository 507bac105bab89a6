/**
 * The deployment files (Dockerfile, .dockerignore, deploy/kubernetes, deploy/grafana) checked
 * against the schemas they are written for and against the real server:
 *
 *   - every YAML document under deploy/kubernetes validates against its kind's schema
 *     (kubernetes-models, @kubernetes-models/prometheus-operator), and has no field its kind
 *     lacks (TypeScript's excess-property check against the same packages' types: the
 *     schemas themselves let unknown fields through); an unknown kind fails;
 *   - the cross-references that break a deployment silently: selectors, port names, probe
 *     paths, grace period against drain + preStop, HPA target and metric, adapter rules;
 *   - the optional API key component (deploy/kubernetes/api-keys): the Deployment it patches
 *     (merged as kustomize does, and compared with `kubectl kustomize` where kubectl exists)
 *     passes every check above, reads its keys from the Secret's file, which the server's user
 *     can read, and keeps its probes and the scrape on paths that need no key; a real server
 *     started with those settings answers the probes and /metrics without a key and the API
 *     only with one;
 *   - the Dockerfile's instructions (base image, user, healthcheck, port, production install)
 *     and what .dockerignore lets into the build context;
 *   - a real server (`slabserve serve`, a child process) started with the Deployment's
 *     SLABSERVE_* settings: its /metrics holds every metric the dashboard, the HPA's adapter
 *     rules and the ServiceMonitor use, with the labels they select on; the probes' paths
 *     answer 200; the Dockerfile's HEALTHCHECK command passes against it; SIGTERM drains
 *     and exits 0.
 *
 * Each checker returns a list of problems; the tests assert it is empty for the real files and
 * not empty for deliberately broken copies, so no check passes vacuously.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join, posix, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml, parseAllDocuments } from 'yaml';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { Service } from 'kubernetes-models/v1/Service';
import { Deployment } from 'kubernetes-models/apps/v1/Deployment';
import { HorizontalPodAutoscaler } from 'kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1/PodDisruptionBudget';
import { ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor';
import { SERVER_DEFAULTS } from '../dist/src/main/server.js';
import { gatewayMetrics, inferenceMetrics, processMetrics } from '../dist/src/shared/telemetry/metrics.js';
import { parseMetrics, type Metrics } from './fixtures/http-client.js';
import { toolOnPath } from './fixtures/system-tools.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const k8sDir = join(root, 'deploy', 'kubernetes');
const dashboardPath = join(root, 'deploy', 'grafana', 'slabserve-dashboard.json');
const ADAPTER_RULES_FILE = 'prometheus-adapter-rules.yaml';
const KUSTOMIZATION_FILE = 'kustomization.yaml';

// ------------------------------------------------------------------ kinds

interface Kind {
  /** The kubernetes-models class: new Model(obj).validate() throws on a schema error. */
  model: new (data: never) => { validate(): void };
  /** Module and interface for the excess-property check. */
  module: string;
  type: string;
}

/** Every kind deploy/kubernetes may hold, by "apiVersion kind". Anything else is an error. */
const KINDS: Record<string, Kind> = {
  'apps/v1 Deployment': { model: Deployment, module: 'kubernetes-models/apps/v1/Deployment', type: 'IDeployment' },
  'v1 Service': { model: Service, module: 'kubernetes-models/v1/Service', type: 'IService' },
  'v1 ConfigMap': { model: ConfigMap, module: 'kubernetes-models/v1/ConfigMap', type: 'IConfigMap' },
  'autoscaling/v2 HorizontalPodAutoscaler': {
    model: HorizontalPodAutoscaler,
    module: 'kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler',
    type: 'IHorizontalPodAutoscaler',
  },
  'policy/v1 PodDisruptionBudget': { model: PodDisruptionBudget, module: 'kubernetes-models/policy/v1/PodDisruptionBudget', type: 'IPodDisruptionBudget' },
  'monitoring.coreos.com/v1 ServiceMonitor': {
    model: ServiceMonitor,
    module: '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor',
    type: 'IServiceMonitor',
  },
};

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Obj = Record<string, any>;

interface Doc {
  file: string;
  index: number;
  obj: Obj;
}

function kindOf(obj: Obj): Kind {
  const key = `${obj.apiVersion} ${obj.kind}`;
  const kind = KINDS[key];
  if (!kind) throw new Error(`unknown kind "${key}": expected one of ${Object.keys(KINDS).join(', ')}`);
  return kind;
}

/** Schema errors of one document (kubernetes-models' validate()), or its unknown kind. */
function schemaProblems(obj: Obj): string[] {
  try {
    const kind = kindOf(obj);
    new kind.model(obj as never).validate();
    return [];
  } catch (err) {
    return [(err as Error).message];
  }
}

/**
 * Fields a kind does not have: each document becomes `const doc: IKind = {...}` in a virtual
 * TypeScript file, type-checked against the packages' own .d.ts (an object literal may only
 * name known properties, at every depth). Returns the diagnostics per document label.
 */
function typeProblems(docs: { label: string; obj: Obj }[]): Map<string, string[]> {
  const files = new Map<string, { label: string; text: string }>();
  docs.forEach((d, i) => {
    const kind = kindOf(d.obj);
    const text = `import type { ${kind.type} } from '${kind.module}';\nexport const doc: ${kind.type} = ${JSON.stringify(d.obj, null, 2)};\n`;
    files.set(join(root, 'test', `__deploy_typecheck_${i}.ts`), { label: d.label, text });
  });
  const options: ts.CompilerOptions = {
    strict: true,
    noEmit: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    skipLibCheck: true,
    types: [],
  };
  const host = ts.createCompilerHost(options);
  const { fileExists, readFile, getSourceFile } = host;
  host.fileExists = (f) => files.has(f) || fileExists.call(host, f);
  host.readFile = (f) => files.get(f)?.text ?? readFile.call(host, f);
  host.getSourceFile = (f, lang, ...rest) => {
    const v = files.get(f);
    return v ? ts.createSourceFile(f, v.text, lang) : getSourceFile.call(host, f, lang, ...rest);
  };
  const program = ts.createProgram([...files.keys()], options, host);
  const out = new Map<string, string[]>(docs.map((d) => [d.label, []]));
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const label = d.file ? files.get(d.file.fileName)?.label ?? d.file.fileName : 'global';
    const list = out.get(label) ?? [];
    list.push(ts.flattenDiagnosticMessageText(d.messageText, ' '));
    out.set(label, list);
  }
  return out;
}

function loadK8sDocs(): Doc[] {
  const docs: Doc[] = [];
  for (const file of readdirSync(k8sDir).filter((f) => /\.ya?ml$/.test(f)).sort()) {
    if (file === KUSTOMIZATION_FILE) continue;
    parseAllDocuments(readFileSync(join(k8sDir, file), 'utf8')).forEach((d, index) => {
      if (d.errors.length > 0) throw new Error(`${file} document ${index}: ${d.errors.map((e) => e.message).join('; ')}`);
      const obj = d.toJS() as Obj | null;
      if (obj !== null) docs.push({ file, index, obj });
    });
  }
  return docs;
}

// ------------------------------------------------------------------ PromQL: metric names and labels

interface Selector {
  name: string;
  labels: string[];
}

/**
 * The series selectors of a PromQL expression (metric name and the label names it matches
 * on) and the labels of its by/without/on/ignoring/group_* clauses. Enough of PromQL for
 * dashboards and adapter rules: strings, label matchers, range selectors, functions,
 * aggregations, binary operators.
 */
function promqlNames(expr: string): { selectors: Selector[]; groupLabels: string[] } {
  type Tok = { t: 'id' | 'str' | 'num' | 'p'; v: string };
  const toks: Tok[] = [];
  let i = 0;
  while (i < expr.length) {
    const c = expr[i]!;
    if (/\s/.test(c)) {
      i++;
    } else if (c === '[') {
      const end = expr.indexOf(']', i); // range / subquery: durations and Grafana's $__rate_interval
      if (end < 0) throw new Error(`unclosed [ in ${expr}`);
      i = end + 1;
    } else if (c === '"' || c === "'" || c === '`') {
      let j = i + 1;
      while (j < expr.length && expr[j] !== c) j += expr[j] === '\\' && c !== '`' ? 2 : 1;
      if (j >= expr.length) throw new Error(`unclosed string in ${expr}`);
      toks.push({ t: 'str', v: expr.slice(i + 1, j) });
      i = j + 1;
    } else if (/[a-zA-Z_:]/.test(c)) {
      const m = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(expr.slice(i))!;
      toks.push({ t: 'id', v: m[0] });
      i += m[0].length;
    } else if (/[0-9.]/.test(c)) {
      // a number, or a duration (offset 5m, 1h30m)
      const m = /^(?:0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?(?:(?:ms|[smhdwy])(?:[0-9]+(?:ms|[smhdwy]))*)?)/.exec(expr.slice(i));
      if (!m) throw new Error(`bad number at ${i} in ${expr}`);
      toks.push({ t: 'num', v: m[0] });
      i += m[0].length;
    } else if ('(){},'.includes(c)) {
      toks.push({ t: 'p', v: c });
      i++;
    } else {
      const m = /^(?:=~|!~|!=|==|>=|<=|[=<>+\-*/%^])/.exec(expr.slice(i));
      if (!m) throw new Error(`unexpected "${c}" at ${i} in ${expr}`);
      toks.push({ t: 'p', v: m[0] });
      i += m[0].length;
    }
  }
  const GROUPING = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right']);
  const KEYWORDS = new Set(['and', 'or', 'unless', 'bool', 'offset', 'atan2', 'inf', 'nan', 'Inf', 'NaN']);
  const AGGREGATIONS = new Set(['sum', 'min', 'max', 'avg', 'group', 'stddev', 'stdvar', 'count', 'count_values', 'bottomk', 'topk', 'quantile', 'limitk', 'limit_ratio']);
  const selectors: Selector[] = [];
  const groupLabels: string[] = [];
  /** Label matchers from the { at k; returns the index after } and the label names (and __name__'s value). */
  const matchers = (k: number): { end: number; labels: string[]; name?: string } => {
    const labels: string[] = [];
    let name: string | undefined;
    let j = k + 1;
    while (toks[j] && toks[j]!.v !== '}') {
      const [label, op, value] = [toks[j], toks[j + 1], toks[j + 2]];
      if (label?.t !== 'id' || op?.t !== 'p' || !['=', '!=', '=~', '!~'].includes(op.v) || value?.t !== 'str') {
        throw new Error(`bad label matcher in ${expr}`);
      }
      if (label.v === '__name__' && op.v === '=') name = value.v;
      else labels.push(label.v);
      j += 3;
      if (toks[j]?.v === ',') j++;
    }
    if (!toks[j]) throw new Error(`unclosed { in ${expr}`);
    return { end: j + 1, labels, ...(name ? { name } : {}) };
  };
  let k = 0;
  while (k < toks.length) {
    const tok = toks[k]!;
    const next = toks[k + 1];
    if (tok.t === 'id' && GROUPING.has(tok.v)) {
      k++;
      if (toks[k]?.v === '(') {
        for (k++; toks[k] && toks[k]!.v !== ')'; k++) if (toks[k]!.t === 'id') groupLabels.push(toks[k]!.v);
        k++;
      }
    } else if (tok.t === 'id' && (KEYWORDS.has(tok.v) || next?.v === '(' || (AGGREGATIONS.has(tok.v) && next?.t === 'id' && GROUPING.has(next.v)))) {
      k++; // function, aggregation or keyword
    } else if (tok.t === 'id') {
      if (next?.v === '{') {
        const m = matchers(k + 1);
        selectors.push({ name: tok.v, labels: m.labels });
        k = m.end;
      } else {
        selectors.push({ name: tok.v, labels: [] });
        k++;
      }
    } else if (tok.v === '{') {
      const m = matchers(k);
      if (!m.name) throw new Error(`a selector without a metric name in ${expr}`);
      selectors.push({ name: m.name, labels: m.labels });
      k = m.end;
    } else {
      k++;
    }
  }
  return { selectors, groupLabels };
}

/** Labels Prometheus adds to every scraped series (job, instance) and the Prometheus Operator's target labels. */
const TARGET_LABELS = new Set(['job', 'instance', 'namespace', 'pod', 'service', 'container', 'endpoint']);

/** What a scrape offers: metric families with their types, and the label names seen per series name. */
interface Catalogue {
  types: Map<string, string>;
  labels: Map<string, Set<string>>;
}

/** The family a series name belongs to, or null: histogram series only exist as _bucket, _sum and _count. */
function familyOf(series: string, types: Map<string, string>): string | null {
  const type = types.get(series);
  if (type === 'counter' || type === 'gauge' || type === 'untyped' || type === 'summary') return series;
  for (const suffix of ['_bucket', '_sum', '_count']) {
    if (!series.endsWith(suffix)) continue;
    const base = series.slice(0, -suffix.length);
    const t = types.get(base);
    if (t === 'histogram' || (t === 'summary' && suffix !== '_bucket')) return base;
  }
  return null;
}

/** Problems with the metric names and label names a PromQL expression uses. */
function exprProblems(expr: string, cat: Catalogue, where: string): string[] {
  let parsed;
  try {
    parsed = promqlNames(expr);
  } catch (err) {
    return [`${where}: ${(err as Error).message}`];
  }
  const problems: string[] = [];
  if (parsed.selectors.length === 0) problems.push(`${where}: no metric in "${expr}"`);
  const known = new Set(TARGET_LABELS);
  for (const s of parsed.selectors) {
    const family = familyOf(s.name, cat.types);
    if (!family) {
      problems.push(`${where}: ${s.name} is not in the scrape${cat.types.get(s.name) === 'histogram' ? ' (a histogram: use _bucket, _sum or _count)' : ''}`);
      continue;
    }
    const labels = new Set([...(cat.labels.get(s.name) ?? []), ...(cat.labels.get(family) ?? []), ...TARGET_LABELS]);
    if (s.name.endsWith('_bucket') && family !== s.name) labels.add('le');
    for (const l of s.labels) if (!labels.has(l)) problems.push(`${where}: ${s.name} has no label "${l}" (it has ${[...labels].join(', ')})`);
    for (const l of labels) known.add(l);
  }
  for (const l of parsed.groupLabels) if (!known.has(l)) problems.push(`${where}: grouping label "${l}" is on none of its metrics`);
  return problems;
}

/** Label names per metric as slabserve declares them (src/shared/telemetry/metrics.ts), for series a CPU scrape has no sample of. */
function declaredLabels(): Map<string, Set<string>> {
  const registry = new Registry();
  gatewayMetrics(registry);
  inferenceMetrics(registry);
  processMetrics(registry, { models: () => [], ready: () => true, heartbeatAgeSeconds: () => 0, deviceMemory: () => null, threadCpuSeconds: () => new Map() });
  const out = new Map<string, Set<string>>();
  for (const m of registry.getMetricsAsArray()) {
    const names = (m as unknown as { labelNames?: unknown }).labelNames;
    if (!Array.isArray(names)) throw new Error(`prom-client metric ${(m as unknown as { name: string }).name} has no labelNames array`);
    out.set((m as unknown as { name: string }).name, new Set(names as string[]));
  }
  return out;
}

function catalogue(scrape: Metrics, declared: Map<string, Set<string>>): Catalogue {
  const labels = new Map<string, Set<string>>();
  for (const [name, set] of declared) labels.set(name, new Set(set));
  for (const s of scrape.samples) {
    const set = labels.get(s.name) ?? new Set<string>();
    for (const l of Object.keys(s.labels)) set.add(l);
    labels.set(s.name, set);
  }
  // a family declared in the source but absent from the scrape stays absent: types come from the scrape alone
  return { types: scrape.types, labels };
}

// ------------------------------------------------------------------ Prometheus Adapter rules

interface AdapterRule {
  seriesQuery: string;
  resources?: { overrides?: Record<string, { resource?: string; group?: string }>; template?: string };
  name?: { matches?: string; as?: string };
  metricsQuery: string;
}

function adapterRules(docs: Doc[]): AdapterRule[] {
  const cm = docs.find((d) => d.file === ADAPTER_RULES_FILE && d.obj.kind === 'ConfigMap');
  if (!cm) throw new Error(`${ADAPTER_RULES_FILE} holds no ConfigMap`);
  const text = cm.obj.data?.['config.yaml'];
  if (typeof text !== 'string') throw new Error(`${ADAPTER_RULES_FILE}: no data."config.yaml"`);
  const config = parseYaml(text) as { rules?: AdapterRule[] };
  if (!Array.isArray(config.rules) || config.rules.length === 0) throw new Error(`${ADAPTER_RULES_FILE}: config.yaml has no rules`);
  return config.rules;
}

/** The metric names a rule serves on custom.metrics.k8s.io for each series name, as the adapter names them. */
function exposedName(rule: AdapterRule, series: string): string | null {
  const matches = rule.name?.matches ?? '(.*)';
  const re = new RegExp(matches);
  const m = re.exec(series);
  if (!m) return null;
  // the adapter's default `as` is $1 when the regex has a group, else $0
  const as = rule.name?.as || (m.length > 1 ? '$1' : '$0');
  return as.replace(/\$\{?(\d+)\}?/g, (_, n: string) => m[Number(n)] ?? '');
}

/** The PromQL of a rule's metricsQuery for one series, its template fields filled in as the adapter would. */
function renderMetricsQuery(rule: AdapterRule, series: string): string {
  return rule.metricsQuery
    .replaceAll('<<.Series>>', series)
    .replaceAll('<<.LabelMatchers>>', 'namespace="default",pod=~"slabserve-.*"')
    .replaceAll('<<.GroupBy>>', 'pod');
}

function adapterProblems(rules: AdapterRule[]): string[] {
  const problems: string[] = [];
  rules.forEach((r, i) => {
    const where = `adapter rule ${i}`;
    const sel = promqlNames(r.seriesQuery).selectors;
    if (sel.length !== 1) problems.push(`${where}: seriesQuery should name one metric: ${r.seriesQuery}`);
    const ov = r.resources?.overrides ?? {};
    if (ov.namespace?.resource !== 'namespace' || !['pod', 'pods'].includes(ov.pod?.resource ?? '')) {
      problems.push(`${where}: resources.overrides must map the namespace and pod labels (a Pods metric is per pod)`);
    }
    for (const field of ['<<.Series>>', '<<.LabelMatchers>>', '<<.GroupBy>>']) {
      if (!r.metricsQuery.includes(field)) problems.push(`${where}: metricsQuery lacks ${field}`);
    }
    if (sel[0] && exposedName(r, sel[0].name) === null) problems.push(`${where}: name.matches does not match ${sel[0].name}`);
  });
  return problems;
}

// ------------------------------------------------------------------ cross-references

function matchesLabels(selector: Record<string, string> | undefined, labels: Record<string, string> | undefined): boolean {
  return !!selector && Object.keys(selector).length > 0 && Object.entries(selector).every(([k, v]) => labels?.[k] === v);
}

/** Seconds a preStop hook waits: exec ["sleep", N], a shell's "sleep N", or the sleep action. */
function preStopSeconds(preStop: Obj | undefined): number {
  if (!preStop) return 0;
  if (preStop.sleep?.seconds !== undefined) return Number(preStop.sleep.seconds);
  const cmd: string[] = preStop.exec?.command ?? [];
  const m = /(?:^|\s)sleep\s+(\d+(?:\.\d+)?)\b/.exec(cmd.join(' '));
  return m ? Number(m[1]) : 0;
}

/** Problems between the documents of deploy/kubernetes: selectors, ports, probes, grace period, HPA. */
function crossReferenceProblems(docs: Doc[], env: { slabserveVars: Set<string>; adapterNames: Set<string> }): string[] {
  const problems: string[] = [];
  const one = (kind: string): Obj | undefined => {
    const found = docs.filter((d) => d.obj.kind === kind);
    if (found.length !== 1) problems.push(`expected one ${kind}, found ${found.length}`);
    return found[0]?.obj;
  };
  const dep = one('Deployment');
  const svc = one('Service');
  const hpa = one('HorizontalPodAutoscaler');
  const pdb = one('PodDisruptionBudget');
  const sm = one('ServiceMonitor');
  if (!dep || !svc || !hpa || !pdb || !sm) return problems;

  const podLabels: Record<string, string> = dep.spec?.template?.metadata?.labels ?? {};
  if (!matchesLabels(dep.spec?.selector?.matchLabels, podLabels)) problems.push('Deployment: selector does not match its pod labels');
  if (!matchesLabels(svc.spec?.selector, podLabels)) problems.push("Service: selector does not match the Deployment's pod labels");
  if (!matchesLabels(pdb.spec?.selector?.matchLabels, podLabels)) problems.push("PodDisruptionBudget: selector does not match the Deployment's pod labels");
  if (!matchesLabels(sm.spec?.selector?.matchLabels, svc.metadata?.labels)) problems.push("ServiceMonitor: selector does not match the Service's labels");

  const containers: Obj[] = dep.spec?.template?.spec?.containers ?? [];
  if (containers.length !== 1) problems.push(`Deployment: expected one container, found ${containers.length}`);
  const c = containers[0] ?? {};
  const ports: Obj[] = c.ports ?? [];
  const envVars: Obj[] = c.env ?? [];
  const envValue = (name: string): string | undefined => envVars.find((e) => e.name === name)?.value;
  const listenPort = Number(envValue('SLABSERVE_PORT') ?? SERVER_DEFAULTS.port);
  const http = ports.find((p) => p.containerPort === listenPort);
  if (!http) problems.push(`Deployment: no container port ${listenPort} (the port slabserve listens on)`);
  /** A port reference (name or number) resolves to the container port slabserve listens on. */
  const isHttp = (ref: unknown) => !!http && (ref === http.name || ref === http.containerPort);

  for (const e of envVars) {
    if (/^SLABSERVE_/.test(e.name) && !env.slabserveVars.has(e.name)) problems.push(`Deployment: ${e.name} is not a slabserve setting`);
  }

  const svcPorts: Obj[] = svc.spec?.ports ?? [];
  for (const p of svcPorts) if (!isHttp(p.targetPort ?? p.port)) problems.push(`Service: port ${p.name} targets ${p.targetPort}, not the container's port`);
  for (const ep of (sm.spec?.endpoints ?? []) as Obj[]) {
    if (!svcPorts.some((p) => p.name === ep.port)) problems.push(`ServiceMonitor: endpoint port "${ep.port}" is no port name of the Service`);
    if ((ep.path ?? '/metrics') !== '/metrics') problems.push(`ServiceMonitor: endpoint path ${ep.path}, slabserve serves /metrics`);
  }

  const probe = (name: string, path: string) => {
    const p = c[name]?.httpGet;
    if (!p) problems.push(`Deployment: no ${name} httpGet`);
    else {
      if (p.path !== path) problems.push(`Deployment: ${name} path ${p.path}, expected ${path}`);
      if (!isHttp(p.port)) problems.push(`Deployment: ${name} port ${p.port} is not the container's port`);
    }
  };
  probe('readinessProbe', '/readyz');
  probe('livenessProbe', '/livez');

  const drainSeconds = Number(envValue('SLABSERVE_DRAIN_TIMEOUT_MS') ?? SERVER_DEFAULTS.drainTimeoutMs) / 1000;
  const sleep = preStopSeconds(c.lifecycle?.preStop);
  if (!(sleep > 0)) problems.push('Deployment: no preStop sleep (the endpoint must be removed before the drain starts)');
  const grace = Number(dep.spec?.template?.spec?.terminationGracePeriodSeconds ?? 30);
  if (!(grace > drainSeconds + sleep)) problems.push(`Deployment: terminationGracePeriodSeconds ${grace} <= drain ${drainSeconds} s + preStop ${sleep} s`);

  if (String(c.resources?.limits?.['nvidia.com/gpu']) !== '1') problems.push('Deployment: limits nvidia.com/gpu must be 1 (one process serves one device)');
  const podSec = dep.spec?.template?.spec?.securityContext ?? {};
  const sec = { ...podSec, ...(c.securityContext ?? {}) };
  if (sec.runAsNonRoot !== true || sec.runAsUser === 0) problems.push('Deployment: must run as non-root (runAsNonRoot: true, runAsUser not 0)');

  const ref = hpa.spec?.scaleTargetRef ?? {};
  if (ref.kind !== 'Deployment' || ref.name !== dep.metadata?.name || ref.apiVersion !== 'apps/v1') {
    problems.push(`HorizontalPodAutoscaler: scaleTargetRef ${ref.apiVersion} ${ref.kind} ${ref.name} is not the Deployment`);
  }
  const metrics: Obj[] = hpa.spec?.metrics ?? [];
  if (metrics.length === 0) problems.push('HorizontalPodAutoscaler: no metrics');
  for (const m of metrics) {
    if (m.type !== 'Pods') problems.push(`HorizontalPodAutoscaler: metric type ${m.type}, expected Pods (custom.metrics.k8s.io)`);
    const name = m.pods?.metric?.name;
    if (!env.adapterNames.has(name)) problems.push(`HorizontalPodAutoscaler: metric ${name} is not served by the adapter rules (${[...env.adapterNames].join(', ')})`);
  }
  return problems;
}

// ------------------------------------------------------------------ Dockerfile

interface Instruction {
  op: string;
  args: string;
  line: number;
}
interface Stage {
  from: string;
  name?: string;
  body: Instruction[];
}

/** Instructions (continuations joined, comments dropped) split into stages, global ARGs substituted into FROM. */
function parseDockerfile(text: string): Stage[] {
  const instructions: Instruction[] = [];
  let buf = '';
  let start = 0;
  text.split('\n').forEach((raw, i) => {
    const line = raw.replace(/\r$/, '');
    if (/^\s*#/.test(line)) return; // comments (and parser directives), also inside a continuation
    if (buf === '' && line.trim() === '') return;
    if (buf === '') start = i + 1;
    if (/\\\s*$/.test(line)) {
      buf += line.replace(/\\\s*$/, ' ');
      return;
    }
    buf += line;
    const m = /^\s*([A-Za-z]+)\s*(.*)$/s.exec(buf);
    if (m) instructions.push({ op: m[1]!.toUpperCase(), args: m[2]!.trim(), line: start });
    buf = '';
  });
  const globals = new Map<string, string>();
  const stages: Stage[] = [];
  for (const ins of instructions) {
    if (ins.op === 'FROM') {
      const m = /^(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$/i.exec(ins.args);
      if (!m) throw new Error(`Dockerfile line ${ins.line}: bad FROM ${ins.args}`);
      const from = m[1]!.replace(/\$\{(\w+)\}|\$(\w+)/g, (_, a: string, b: string) => globals.get(a ?? b) ?? '');
      stages.push({ from, ...(m[2] ? { name: m[2] } : {}), body: [] });
    } else if (stages.length === 0) {
      if (ins.op === 'ARG') {
        const m = /^(\w+)(?:=(.*))?$/.exec(ins.args);
        if (m) globals.set(m[1]!, (m[2] ?? '').replace(/^"(.*)"$/, '$1'));
      }
    } else {
      stages[stages.length - 1]!.body.push(ins);
    }
  }
  return stages;
}

/** The stages a stage builds on, root first, ending with itself; and the external image at the root. */
function chainOf(stages: Stage[], stage: Stage): { chain: Stage[]; image: string } {
  const chain = [stage];
  let cur = stage;
  for (;;) {
    const parent = stages.find((s) => s.name !== undefined && s.name === cur.from);
    if (!parent || chain.includes(parent)) break;
    chain.unshift(parent);
    cur = parent;
  }
  return { chain, image: chain[0]!.from };
}

/** Exec form (JSON array) of CMD / HEALTHCHECK CMD, or null for the shell form. */
function execForm(args: string): string[] | null {
  try {
    const v = JSON.parse(args) as unknown;
    return Array.isArray(v) && v.every((x) => typeof x === 'string') ? (v as string[]) : null;
  } catch {
    return null;
  }
}

function healthcheckCommand(stages: Stage[]): string[] | null {
  const last = stages[stages.length - 1];
  if (!last) return null;
  const all = chainOf(stages, last).chain.flatMap((s) => s.body);
  const hc = all.filter((i) => i.op === 'HEALTHCHECK').pop();
  if (!hc) return null;
  const m = /^(?:--\S+\s+)*CMD\s+(.*)$/s.exec(hc.args);
  return m ? execForm(m[1]!.trim()) : null;
}

const CUDA_RUNTIME_IMAGE = /^(?:(?:docker\.io|nvcr\.io)\/)?nvidia\/cuda:13\.\d+\.\d+-cudnn-runtime-ubuntu\d+\.\d+(?:@sha256:[0-9a-f]{64})?$/;

/** Problems with the Dockerfile's stated requirements. */
function dockerfileProblems(text: string, env: { slabserveVars: Set<string>; included: (path: string) => boolean }): string[] {
  const problems: string[] = [];
  let stages: Stage[];
  try {
    stages = parseDockerfile(text);
  } catch (err) {
    return [(err as Error).message];
  }
  const last = stages[stages.length - 1];
  if (!last) return ['no FROM'];
  const { chain, image } = chainOf(stages, last);
  if (!CUDA_RUNTIME_IMAGE.test(image)) problems.push(`final image builds on ${image}, expected nvidia/cuda:13.x.y-cudnn-runtime-ubuntu*`);
  const finalBody = chain.flatMap((s) => s.body);
  const lastOf = (op: string) => finalBody.filter((i) => i.op === op).pop();

  const user = lastOf('USER')?.args.split(':')[0];
  if (!user || user === 'root' || user === '0') problems.push(`final stage runs as ${user ?? 'root (no USER)'}`);

  const hc = healthcheckCommand(stages);
  if (!hc) problems.push('no HEALTHCHECK in exec form');
  else if (!hc.join(' ').includes('/readyz')) problems.push('HEALTHCHECK does not hit /readyz');

  const exposed = finalBody.filter((i) => i.op === 'EXPOSE').flatMap((i) => i.args.split(/\s+/).map((p) => p.replace(/\/tcp$/, '')));
  if (!exposed.includes('8080')) problems.push(`EXPOSE ${exposed.join(' ') || 'nothing'}, expected 8080`);

  const envs = new Map<string, string>();
  for (const ins of finalBody.filter((i) => i.op === 'ENV')) {
    for (const m of ins.args.matchAll(/(\w+)=("(?:[^"\\]|\\.)*"|\S+)/g)) envs.set(m[1]!, m[2]!.replace(/^"(.*)"$/, '$1'));
  }
  for (const name of envs.keys()) if (/^SLABSERVE_/.test(name) && !env.slabserveVars.has(name)) problems.push(`ENV ${name} is not a slabserve setting`);
  if (envs.has('SLABSERVE_PORT') && !exposed.includes(envs.get('SLABSERVE_PORT')!)) problems.push(`SLABSERVE_PORT ${envs.get('SLABSERVE_PORT')} is not exposed`);

  const runs = (s: Stage) => s.body.filter((i) => i.op === 'RUN').map((i) => i.args);
  const finalRuns = chain.flatMap(runs);
  if (!finalRuns.some((r) => /\bnpm ci\b[^;&|]*--omit=dev/.test(r))) problems.push('final stage does not install with npm ci --omit=dev');
  if (finalRuns.some((r) => /\bnpm (?:ci|install)\b(?![^;&|]*--omit=dev)/.test(r))) problems.push('final stage installs dev dependencies (npm ci without --omit=dev)');
  if (!finalRuns.some((r) => /install-cuda-provider\.mjs|npm run cuda:install/.test(r))) problems.push('the CUDA provider is not placed (scripts/install-cuda-provider.mjs)');

  // a stage builds: full npm ci, tsc, the models
  const builder = stages.find((s) => runs(s).some((r) => /\bnpm ci\b(?![^;&|]*--omit)/.test(r)) && runs(s).some((r) => /\btsc\b|npm run build/.test(r)));
  if (!builder) problems.push('no stage runs npm ci (with dev dependencies) and the TypeScript build');
  const generates = stages.find((s) => runs(s).some((r) => /dist\/models\/generate\.js/.test(r)));
  /** Whether the final stage copies, from stage `from`, a source that `wanted` accepts. */
  const copiesFrom = (from: Stage, wanted: (src: string) => boolean) =>
    finalBody.some((i) => {
      if (i.op !== 'COPY' || /--from=(\S+)/.exec(i.args)?.[1] !== from.name) return false;
      const parts = (execForm(i.args) ?? i.args.split(/\s+/)).filter((p) => !p.startsWith('--'));
      return parts.slice(0, -1).some((src) => wanted(posix.normalize(src).replace(/\/+$/, '')));
    });
  if (!generates) problems.push('no stage generates the models (node dist/models/generate.js)');
  else if (!chain.includes(generates) && !copiesFrom(generates, (src) => posix.basename(src) === 'models' && !src.split('/').includes('dist'))) {
    problems.push('the generated models do not reach the final stage');
  }
  if (builder && !chain.includes(builder) && !copiesFrom(builder, (src) => src.split('/').includes('dist'))) {
    problems.push('the build output (dist) does not reach the final stage');
  }

  // onnxruntime-node's CUDA 12 download is skipped by its own variable wherever npm ci runs
  for (const s of stages) {
    s.body.forEach((ins, k) => {
      if (ins.op !== 'RUN' || !/\bnpm ci\b/.test(ins.args)) return;
      const stageChain = chainOf(stages, s).chain;
      const before = [...stageChain.slice(0, -1).flatMap((p) => p.body), ...s.body.slice(0, k)];
      if (!/ONNXRUNTIME_NODE_INSTALL=skip\b/.test(ins.args) && !before.some((i) => i.op === 'ENV' && /(?:^|\s)ONNXRUNTIME_NODE_INSTALL=skip(?:\s|$)/.test(i.args))) {
        problems.push(`Dockerfile line ${ins.line}: npm ci without ONNXRUNTIME_NODE_INSTALL=skip`);
      }
    });
  }

  // Node.js: an LTS line the project supports (package.json's engines), its download checked against a pinned digest
  const args = new Map(text.split('\n').flatMap((l) => [...l.matchAll(/^ARG (\w+)=(\S+)/g)].map((m) => [m[1]!, m[2]!] as const)));
  const nodeMajor = Number(args.get('NODE_VERSION')?.split('.')[0]);
  if (!(nodeMajor >= 22 && nodeMajor % 2 === 0)) problems.push(`NODE_VERSION ${args.get('NODE_VERSION') ?? '(none)'} is not an LTS line from 22 on`);
  const install = stages.flatMap(runs).find((r) => /\$\{NODE_VERSION\}/.test(r));
  if (!install || !/echo "\$\{NODE_SHA(?:256|512)\}\s+(\S+)" \| sha(?:256|512)sum -c/.test(install)) problems.push('the Node.js download is not checked against a pinned digest');
  else if (!/^[0-9a-f]{64}(?:[0-9a-f]{64})?$/.test(args.get('NODE_SHA512') ?? args.get('NODE_SHA256') ?? '')) problems.push('NODE_SHA512 is not a hex digest');

  // build-context sources exist and are not ignored
  for (const s of stages) {
    for (const ins of s.body.filter((i) => i.op === 'COPY' || i.op === 'ADD')) {
      if (/--from=/.test(ins.args)) continue;
      const parts = (execForm(ins.args) ?? ins.args.split(/\s+/)).filter((p) => !p.startsWith('--'));
      for (const src of parts.slice(0, -1)) {
        const rel = posix.normalize(src).replace(/^\.?\/+/, '').replace(/\/+$/, '');
        const abs = join(root, rel);
        if (!existsSync(abs)) problems.push(`Dockerfile line ${ins.line}: COPY source ${src} does not exist`);
        else if (statSync(abs).isDirectory()) {
          const files = listFiles(abs).map((f) => relative(root, f).split('\\').join('/'));
          if (!files.some(env.included)) problems.push(`Dockerfile line ${ins.line}: everything in ${src} is excluded by .dockerignore`);
        } else if (!env.included(rel)) problems.push(`Dockerfile line ${ins.line}: ${src} is excluded by .dockerignore`);
      }
    }
  }

  const cmd = lastOf('CMD');
  const argv = cmd ? execForm(cmd.args) : null;
  if (!argv) problems.push('no CMD in exec form');
  else {
    if (argv[0] !== 'node' || argv[1] !== 'dist/src/cli.js' || argv[2] !== 'serve') problems.push(`CMD ${argv.join(' ')} does not run node dist/src/cli.js serve`);
    // a flag on the command line wins over its SLABSERVE_* variable: settings belong in ENV
    const flags = argv.slice(3).filter((a) => a.startsWith('--'));
    if (flags.length > 0) problems.push(`CMD passes ${flags.join(' ')}: a flag would override its SLABSERVE_* variable`);
  }
  return problems;
}

function listFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? listFiles(join(dir, e.name)) : [join(dir, e.name)]));
}

/**
 * .dockerignore as Docker reads it (moby/patternmatcher): patterns cleaned, `**` any depth,
 * `*` and `?` within a path element, a match on a parent folder excludes its contents,
 * `!` re-includes, the last matching pattern wins. Returns whether a path enters the context.
 */
function dockerignore(text: string): (path: string) => boolean {
  const rules = text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'))
    .map((l) => {
      const negate = l.startsWith('!');
      const pattern = posix.normalize((negate ? l.slice(1) : l).trim()).replace(/^\/+/, '').replace(/\/+$/, '');
      let re = '';
      for (let i = 0; i < pattern.length; i++) {
        const ch = pattern[i]!;
        if (ch === '*' && pattern[i + 1] === '*') {
          i++;
          if (pattern[i + 1] === '/') {
            i++;
            re += '(?:.*/)?';
          } else re += '.*';
        } else if (ch === '*') re += '[^/]*';
        else if (ch === '?') re += '[^/]';
        else re += ch.replace(/[.+^${}()|[\]\\]/g, '\\$&');
      }
      return { negate, re: new RegExp(`^${re}$`) };
    });
  return (path: string) => {
    const parts = path.split('/');
    let excluded = false;
    for (const r of rules) {
      let hit = false;
      for (let n = parts.length; n >= 1 && !hit; n--) hit = r.re.test(parts.slice(0, n).join('/'));
      if (hit) excluded = !r.negate;
    }
    return !excluded;
  };
}

// ------------------------------------------------------------------ the API key component

const API_KEYS_DIR = join(k8sDir, 'api-keys');
/** The Secret the component mounts. */
const API_KEYS_SECRET = 'slabserve-api-keys';
/** What answers without a key (docs/security.md): the only paths a probe may use once keys are on. */
const OPEN_PATHS = new Set(['/livez', '/readyz', '/health', '/v2/health/live', '/v2/health/ready']);

interface Component {
  kustomization: Obj;
  /** The kustomization's text (its instructions are checked against the patch). */
  text: string;
  patches: { path: string; obj: Obj }[];
}

function loadComponent(dir: string): Component {
  const text = readFileSync(join(dir, KUSTOMIZATION_FILE), 'utf8');
  const kustomization = parseYaml(text) as Obj;
  const patches = ((kustomization.patches ?? []) as Obj[]).map((p) => ({ path: p.path as string, obj: parseYaml(readFileSync(join(dir, p.path), 'utf8')) as Obj }));
  return { kustomization, text, patches };
}

/** The merge key of each list a patch may touch (Kubernetes' patchMergeKey for these fields). */
const MERGE_KEYS: Record<string, string> = { containers: 'name', initContainers: 'name', env: 'name', volumeMounts: 'mountPath', volumes: 'name' };

/**
 * A strategic merge patch as kustomize applies it, for the lists in MERGE_KEYS: maps merge
 * recursively, list items merge with the base item of the same key, new items go first (in
 * the patch's order). Any other list, or a `$patch` directive, throws: this merge would not
 * know what kustomize does with it.
 */
function strategicMerge(base: unknown, patch: unknown, field = ''): unknown {
  if (Array.isArray(patch)) {
    const key = MERGE_KEYS[field];
    if (!key) throw new Error(`the patch sets the list ${field}, whose merge this test does not model`);
    const out = Array.isArray(base) ? clone(base as Obj[]) : [];
    const added: Obj[] = [];
    for (const item of patch as Obj[]) {
      const at = out.findIndex((b) => b[key] === item[key]);
      if (at >= 0) out[at] = strategicMerge(out[at], item) as Obj;
      else added.push(clone(item));
    }
    return [...added, ...out];
  }
  if (patch !== null && typeof patch === 'object') {
    const out: Obj = base !== null && typeof base === 'object' && !Array.isArray(base) ? clone(base as Obj) : {};
    for (const [k, v] of Object.entries(patch as Obj)) {
      if (k.startsWith('$')) throw new Error(`patch directive ${k} is not modelled`);
      out[k] = strategicMerge(out[k], v, k);
    }
    return out;
  }
  return patch;
}

/** The documents with the component's patches applied (each patch targets a document by kind and name). */
function applyComponent(docs: Doc[], component: Component): Doc[] {
  const out = docs.map((d) => ({ ...d, obj: clone(d.obj) }));
  for (const p of component.patches) {
    const target = out.find((d) => d.obj.kind === p.obj.kind && d.obj.metadata?.name === p.obj.metadata?.name);
    if (!target) throw new Error(`${p.path}: no ${p.obj.kind} ${p.obj.metadata?.name} to patch`);
    target.obj = strategicMerge(target.obj, p.obj) as Obj;
  }
  return out;
}

/** Problems of a Deployment that is to require API keys from the component's Secret. */
function apiKeyProblems(docs: Doc[], component: Component): string[] {
  const problems: string[] = [];
  const k = component.kustomization;
  if (k.apiVersion !== 'kustomize.config.k8s.io/v1alpha1' || k.kind !== 'Component') problems.push(`api-keys: ${k.apiVersion} ${k.kind}, expected a kustomize Component`);
  const dep = docs.find((d) => d.obj.kind === 'Deployment')?.obj;
  const sm = docs.find((d) => d.obj.kind === 'ServiceMonitor')?.obj;
  const pod: Obj = dep?.spec?.template?.spec ?? {};
  const c: Obj = pod.containers?.[0] ?? {};
  const envVars: Obj[] = c.env ?? [];
  const envOf = (name: string) => envVars.find((e) => e.name === name);

  if (envOf('SLABSERVE_API_KEY')?.value !== undefined) problems.push('Deployment: SLABSERVE_API_KEY has a literal value: keys belong in a Secret');
  const file: unknown = envOf('SLABSERVE_API_KEY_FILE')?.value;
  if (typeof file !== 'string' || !file.startsWith('/')) {
    problems.push('Deployment: no SLABSERVE_API_KEY_FILE with an absolute path');
  } else {
    const mount = ((c.volumeMounts ?? []) as Obj[]).find((m) => file.startsWith(`${String(m.mountPath).replace(/\/+$/, '')}/`));
    const volume = mount && ((pod.volumes ?? []) as Obj[]).find((v) => v.name === mount.name);
    if (!mount || !volume) problems.push(`Deployment: SLABSERVE_API_KEY_FILE ${file} is in no mounted volume`);
    else if (volume.secret?.secretName !== API_KEYS_SECRET) problems.push(`Deployment: ${file} is not from the Secret ${API_KEYS_SECRET}`);
    else {
      if (mount.readOnly !== true) problems.push(`Deployment: the mount of ${API_KEYS_SECRET} is not readOnly`);
      const name = file.slice(String(mount.mountPath).replace(/\/+$/, '').length + 1);
      const item = ((volume.secret.items ?? []) as Obj[]).find((i) => i.path === name);
      if (volume.secret.items && !item) problems.push(`Deployment: the Secret's items project no ${name}`);
      // the key the instructions create the Secret with must be the file the server reads
      const key = item?.key ?? name;
      const told = /--from-file=([\w.-]+)=/.exec(component.text)?.[1];
      if (told !== key) problems.push(`api-keys: the instructions create the Secret with key ${told}, the server reads ${key}`);
      // Secret files belong to root (group: fsGroup when set); the server runs as runAsUser, not root
      const mode = Number(item?.mode ?? volume.secret.defaultMode ?? 0o644);
      const sec = { ...(pod.securityContext ?? {}), ...(c.securityContext ?? {}) };
      // (fsGroup is a supplementary group of every container process: group-readable is enough)
      const readable = (mode & 0o004) !== 0 || ((mode & 0o040) !== 0 && pod.securityContext?.fsGroup !== undefined);
      if (!readable) problems.push(`Deployment: ${file} (mode 0${mode.toString(8)}) is not readable by user ${sec.runAsUser}`);
    }
  }
  for (const name of ['readinessProbe', 'livenessProbe', 'startupProbe']) {
    const path = c[name]?.httpGet?.path;
    if (path !== undefined && !OPEN_PATHS.has(path)) problems.push(`Deployment: ${name} ${path} needs a key (probes send none)`);
  }
  const metricsAuth = /^(true|yes|1)$/i.test(String(envOf('SLABSERVE_METRICS_AUTH')?.value ?? ''));
  if (metricsAuth && !((sm?.spec?.endpoints ?? []) as Obj[]).every((e) => e.authorization || e.bearerTokenSecret)) {
    problems.push('ServiceMonitor: SLABSERVE_METRICS_AUTH is on and the endpoint sends no key');
  }
  return problems;
}

// ------------------------------------------------------------------ the real server

/** SLABSERVE_* variable names `slabserve serve` reads (from its --help). */
function slabserveVariables(): Set<string> {
  const r = spawnSync(process.execPath, [join(root, 'dist/src/cli.js'), 'serve', '--help'], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`slabserve serve --help failed: ${r.stderr}`);
  const vars = new Set(r.stdout.match(/SLABSERVE_[A-Z0-9_]+/g) ?? []);
  if (!vars.has('SLABSERVE_PORT') || !vars.has('SLABSERVE_DRAIN_TIMEOUT_MS')) throw new Error(`unexpected --help output:\n${r.stdout}`);
  return vars;
}

interface Child {
  proc: ChildProcess;
  url: string;
  stderr: () => string;
  exited: Promise<number | null>;
}

/** `slabserve serve` as a child process with these variables; resolves once it is ready. */
function startCli(env: Record<string, string>): Promise<Child> {
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SLABSERVE_'))) as Record<string, string>;
  const proc = spawn(process.execPath, [join(root, 'dist/src/cli.js'), 'serve'], { env: { ...base, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  const exited = new Promise<number | null>((res) => proc.on('exit', (code) => res(code)));
  return new Promise((resolve, reject) => {
    let url: string | undefined;
    proc.stderr!.setEncoding('utf8');
    proc.stderr!.on('data', (chunk: string) => {
      err += chunk;
      url ??= /listening on (http:\/\/[^\s:]+:\d+)/.exec(err)?.[1];
      if (url && /slabserve: ready at /.test(err)) resolve({ proc, url, stderr: () => err, exited });
    });
    void exited.then((code) => reject(new Error(`slabserve serve exited ${code} before it was ready:\n${err}`)));
  });
}

function runCommand(argv: string[], env: Record<string, string>): Promise<number | null> {
  return new Promise((resolve) => {
    const p = spawn(argv[0] === 'node' ? process.execPath : argv[0]!, argv.slice(1), { env: { ...process.env, ...env }, stdio: 'ignore' });
    p.on('exit', (code) => resolve(code));
  });
}

async function closedPort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address() as AddressInfo;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

// ------------------------------------------------------------------ tests

const docs = loadK8sDocs();
const deployment = docs.find((d) => d.obj.kind === 'Deployment')!.obj;
const dockerfileText = readFileSync(join(root, 'Dockerfile'), 'utf8');
const included = dockerignore(readFileSync(join(root, '.dockerignore'), 'utf8'));
const dashboard = JSON.parse(readFileSync(dashboardPath, 'utf8')) as Obj;
let slabserveVars: Set<string>;
let rules: AdapterRule[];

beforeAll(() => {
  slabserveVars = slabserveVariables();
  rules = adapterRules(docs);
});

/** Every custom metric name the adapter rules serve, from the series their seriesQuery names. */
function adapterNames(): Set<string> {
  const names = new Set<string>();
  for (const r of rules) for (const s of promqlNames(r.seriesQuery).selectors) {
    const n = exposedName(r, s.name);
    if (n) names.add(n);
  }
  return names;
}

const clone = <T>(x: T): T => structuredClone(x);

describe('kubernetes manifests: schemas', () => {
  it('holds the documents a deployment needs, each of a known kind', () => {
    const kinds = docs.map((d) => `${d.obj.apiVersion} ${d.obj.kind}`).sort();
    expect(kinds).toEqual(
      [
        'apps/v1 Deployment',
        'autoscaling/v2 HorizontalPodAutoscaler',
        'monitoring.coreos.com/v1 ServiceMonitor',
        'policy/v1 PodDisruptionBudget',
        'v1 ConfigMap',
        'v1 Service',
      ].sort(),
    );
  });

  it('every document validates against its schema', () => {
    for (const d of docs) expect(schemaProblems(d.obj), `${d.file} #${d.index}`).toEqual([]);
  });

  it('validation fails on broken documents and unknown kinds', () => {
    const badReplicas = clone(deployment);
    badReplicas.spec.replicas = 'two';
    expect(schemaProblems(badReplicas).join()).toMatch(/replicas must be integer/);
    const noContainers = clone(deployment);
    delete noContainers.spec.template.spec.containers;
    expect(schemaProblems(noContainers).join()).toMatch(/containers/);
    expect(schemaProblems({ ...clone(deployment), apiVersion: 'apps/v1beta1' }).join()).toMatch(/unknown kind/);
    expect(schemaProblems({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 'x' } }).join()).toMatch(/unknown kind/);
    const sm = clone(docs.find((d) => d.obj.kind === 'ServiceMonitor')!.obj);
    sm.spec.endpoints[0].interval = 'often';
    expect(schemaProblems(sm).join()).toMatch(/interval/);
  });

  it('no document has a field its kind does not define (and a misspelt one is caught)', () => {
    const typo = clone(deployment);
    const c = typo.spec.template.spec.containers[0];
    c.readinesProbe = c.readinessProbe;
    delete c.readinessProbe;
    const wrongType = clone(deployment);
    wrongType.spec.template.spec.containers[0].ports[0].containerPort = '8080';
    const labelled = [
      ...docs.map((d) => ({ label: `${d.file} #${d.index}`, obj: d.obj })),
      { label: 'typo', obj: typo },
      { label: 'wrong-type', obj: wrongType },
    ];
    const problems = typeProblems(labelled);
    for (const d of docs) expect(problems.get(`${d.file} #${d.index}`), `${d.file} #${d.index}`).toEqual([]);
    expect(problems.get('global') ?? []).toEqual([]);
    expect(problems.get('typo')!.join()).toMatch(/readinesProbe.*does not exist in type/);
    expect(problems.get('wrong-type')!.join()).toMatch(/string.*not assignable to type 'number'/);
  });

  it('kustomization.yaml lists every manifest but the adapter rules', () => {
    const k = parseYaml(readFileSync(join(k8sDir, KUSTOMIZATION_FILE), 'utf8')) as Obj;
    expect(k.apiVersion).toBe('kustomize.config.k8s.io/v1beta1');
    expect(k.kind).toBe('Kustomization');
    const expected = [...new Set(docs.map((d) => d.file))].filter((f) => f !== ADAPTER_RULES_FILE).sort();
    expect([...(k.resources as string[])].sort()).toEqual(expected);
  });
});

describe('kubernetes manifests: cross-references', () => {
  const ctx = () => ({ slabserveVars, adapterNames: adapterNames() });

  it('selectors, ports, probes, grace period, GPU, user and HPA agree', () => {
    expect(crossReferenceProblems(docs, ctx())).toEqual([]);
  });

  it('the adapter rules serve per-pod metrics', () => {
    expect(adapterProblems(rules)).toEqual([]);
    expect([...adapterNames()]).toContain(docs.find((d) => d.obj.kind === 'HorizontalPodAutoscaler')!.obj.spec.metrics[0].pods.metric.name);
  });

  it('each deliberately broken reference is reported', () => {
    const broken = (mutate: (by: Record<string, Obj>) => void): string[] => {
      const copy = docs.map((d) => ({ ...d, obj: clone(d.obj) }));
      const by = Object.fromEntries(copy.map((d) => [d.obj.kind as string, d.obj]));
      mutate(by);
      return crossReferenceProblems(copy, ctx());
    };
    const container = (by: Record<string, Obj>) => by.Deployment!.spec.template.spec.containers[0];
    const env = (by: Record<string, Obj>, name: string) => container(by).env.find((e: Obj) => e.name === name);
    expect(broken((by) => (by.Service!.spec.selector = { app: 'other' })).join()).toMatch(/Service: selector/);
    expect(broken((by) => (by.PodDisruptionBudget!.spec.selector.matchLabels = { app: 'other' })).join()).toMatch(/PodDisruptionBudget/);
    expect(broken((by) => (by.ServiceMonitor!.spec.selector.matchLabels = { app: 'other' })).join()).toMatch(/ServiceMonitor: selector/);
    expect(broken((by) => (by.ServiceMonitor!.spec.endpoints[0].port = 'web')).join()).toMatch(/endpoint port "web"/);
    expect(broken((by) => (by.Service!.spec.ports[0].targetPort = 9090)).join()).toMatch(/targets 9090/);
    expect(broken((by) => (container(by).readinessProbe.httpGet.path = '/health')).join()).toMatch(/readinessProbe path/);
    expect(broken((by) => (container(by).livenessProbe.httpGet.path = '/readyz')).join()).toMatch(/livenessProbe path/);
    expect(broken((by) => (container(by).livenessProbe.httpGet.port = 9000)).join()).toMatch(/livenessProbe port/);
    expect(broken((by) => (by.Deployment!.spec.template.spec.terminationGracePeriodSeconds = 30)).join()).toMatch(/terminationGracePeriodSeconds 30/);
    expect(broken((by) => (env(by, 'SLABSERVE_DRAIN_TIMEOUT_MS').value = '60000')).join()).toMatch(/terminationGracePeriodSeconds/);
    expect(broken((by) => delete container(by).lifecycle).join()).toMatch(/no preStop/);
    expect(broken((by) => (env(by, 'SLABSERVE_PORT').value = '9000')).join()).toMatch(/no container port 9000/);
    expect(broken((by) => container(by).env.push({ name: 'SLABSERVE_MAX_BATCH', value: '8' })).join()).toMatch(/SLABSERVE_MAX_BATCH is not/);
    expect(broken((by) => delete container(by).resources.limits['nvidia.com/gpu']).join()).toMatch(/nvidia.com\/gpu/);
    expect(broken((by) => (by.Deployment!.spec.template.spec.securityContext.runAsUser = 0)).join()).toMatch(/non-root/);
    expect(broken((by) => (by.HorizontalPodAutoscaler!.spec.scaleTargetRef.name = 'other')).join()).toMatch(/scaleTargetRef/);
    expect(broken((by) => (by.HorizontalPodAutoscaler!.spec.metrics[0].pods.metric.name = 'slabserve_queue_depth_typo')).join()).toMatch(/not served by the adapter/);
    const badRule = clone(rules[0]!);
    badRule.resources = { overrides: { namespace: { resource: 'namespace' } } };
    badRule.metricsQuery = 'sum(<<.Series>>)';
    expect(adapterProblems([badRule]).join()).toMatch(/namespace and pod.*lacks <<.LabelMatchers>>/s);
  });
});

describe('kubernetes manifests: the optional API key component (api-keys/)', () => {
  const component = loadComponent(API_KEYS_DIR);
  const withKeys = applyComponent(docs, component);
  const patched = withKeys.find((d) => d.obj.kind === 'Deployment')!.obj;
  const ctx = () => ({ slabserveVars, adapterNames: adapterNames() });

  it('is a Component the base does not enable by default; it only patches the Deployment', () => {
    expect(component.kustomization).toMatchObject({ apiVersion: 'kustomize.config.k8s.io/v1alpha1', kind: 'Component' });
    expect(component.patches.map((p) => p.obj.kind)).toEqual(['Deployment']);
    const base = parseYaml(readFileSync(join(k8sDir, KUSTOMIZATION_FILE), 'utf8')) as Obj;
    expect(base.components).toBeUndefined();
    // without it, no key is required: the base Deployment names no key
    expect(apiKeyProblems(docs, component).join()).toMatch(/no SLABSERVE_API_KEY_FILE/);
  });

  it('the patched Deployment validates, passes the cross-references, and reads its keys from the Secret', () => {
    expect(schemaProblems(patched)).toEqual([]);
    const types = typeProblems([{ label: 'patched', obj: patched }]);
    expect(types.get('patched')).toEqual([]);
    expect(types.get('global') ?? []).toEqual([]);
    expect(crossReferenceProblems(withKeys, ctx())).toEqual([]); // SLABSERVE_API_KEY_FILE is in `serve --help`
    expect(apiKeyProblems(withKeys, component)).toEqual([]);
    const c = patched.spec.template.spec.containers[0] as Obj;
    expect(c.readinessProbe.httpGet.path).toBe('/readyz');
    expect(c.livenessProbe.httpGet.path).toBe('/livez');
  });

  it('each broken requirement is reported', () => {
    const broken = (mutate: (dep: Obj, c: Obj) => void, text = component.text): string[] => {
      const copy = withKeys.map((d) => ({ ...d, obj: clone(d.obj) }));
      const dep = copy.find((d) => d.obj.kind === 'Deployment')!.obj;
      mutate(dep, dep.spec.template.spec.containers[0]);
      return [...apiKeyProblems(copy, { ...component, text }), ...crossReferenceProblems(copy, ctx())];
    };
    const volume = (dep: Obj) => dep.spec.template.spec.volumes.find((v: Obj) => v.name === 'api-keys');
    const env = (c: Obj, name: string) => c.env.find((e: Obj) => e.name === name);
    expect(broken((_, c) => (env(c, 'SLABSERVE_API_KEY_FILE').name = 'SLABSERVE_API_KEYS_FILE')).join()).toMatch(/SLABSERVE_API_KEYS_FILE is not a slabserve setting/);
    expect(broken((_, c) => (env(c, 'SLABSERVE_API_KEY_FILE').value = '/etc/keys')).join()).toMatch(/in no mounted volume/);
    expect(broken((dep) => (volume(dep).secret.secretName = 'other')).join()).toMatch(/not from the Secret slabserve-api-keys/);
    expect(broken((_, c) => delete c.volumeMounts.find((m: Obj) => m.name === 'api-keys').readOnly).join()).toMatch(/not readOnly/);
    expect(broken((dep) => delete dep.spec.template.spec.securityContext.fsGroup).join()).toMatch(/mode 0440\) is not readable by user 10001/);
    expect(broken((dep) => (volume(dep).secret.defaultMode = 0o400)).join()).toMatch(/not readable/);
    expect(broken((dep) => (volume(dep).secret.items = [{ key: 'keys', path: 'keys' }])).join()).toMatch(/project no api-keys/);
    expect(broken(() => {}, component.text.replace('--from-file=api-keys=', '--from-file=keys=')).join()).toMatch(/with key keys, the server reads api-keys/);
    expect(broken((_, c) => (c.readinessProbe.httpGet.path = '/info')).join()).toMatch(/readinessProbe \/info needs a key/);
    expect(broken((_, c) => c.env.push({ name: 'SLABSERVE_METRICS_AUTH', value: 'true' })).join()).toMatch(/METRICS_AUTH is on/);
    expect(broken((_, c) => c.env.push({ name: 'SLABSERVE_API_KEY', value: 'sk-in-the-manifest' })).join()).toMatch(/literal value/);
    expect(() => strategicMerge({ a: [1] }, { a: [2] }, '')).toThrow(/does not model/);
  });

  it('kustomize (what `kubectl apply -k` runs) makes the same Deployment as the merge these checks use', { timeout: 180_000 }, () => {
    toolOnPath('kustomize');
    const dir = mkdtempSync(join(tmpdir(), 'slabserve-kustomize-'));
    try {
      const base = relative(dir, k8sDir).split('\\').join('/');
      writeFileSync(join(dir, KUSTOMIZATION_FILE), `resources:\n  - ${base}\ncomponents:\n  - ${base}/api-keys\n`);
      const r = spawnSync('kustomize', ['build', dir], { encoding: 'utf8' });
      expect(r.status, r.stderr).toBe(0);
      const built = parseAllDocuments(r.stdout).map((d) => d.toJS() as Obj);
      expect(built.find((o) => o.kind === 'Deployment')).toEqual(patched);
      // and the base alone is the Deployment as written
      const plain = spawnSync('kustomize', ['build', k8sDir], { encoding: 'utf8' });
      expect(plain.status, plain.stderr).toBe(0);
      expect(parseAllDocuments(plain.stdout).map((d) => d.toJS() as Obj).find((o) => o.kind === 'Deployment')).toEqual(deployment);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('the real server with the API key component (slabserve serve, its Secret as a file)', () => {
  const KEY = 'sk-deploy-test-5f1c0a77d2e94b0c8a6e3b1d';
  let child: Child | undefined;
  let dir: string;

  beforeAll(async () => {
    const patched = applyComponent(docs, loadComponent(API_KEYS_DIR)).find((d) => d.obj.kind === 'Deployment')!.obj;
    const container = patched.spec.template.spec.containers[0] as Obj;
    const env = Object.fromEntries((container.env as Obj[]).map((e) => [e.name as string, String(e.value)]));
    // The Secret's file, where this machine can write it: the same file name under a temp dir.
    dir = mkdtempSync(join(tmpdir(), 'slabserve-keys-'));
    const file = join(dir, posix.basename(env.SLABSERVE_API_KEY_FILE!));
    writeFileSync(file, `# made by test/deploy.test.ts\n${KEY}\n`, { mode: 0o440 });
    child = await startCli({
      ...env,
      SLABSERVE_API_KEY_FILE: file,
      SLABSERVE_PORT: '0',
      SLABSERVE_HOST: '127.0.0.1',
      SLABSERVE_DEVICE: 'cpu',
      SLABSERVE_MODEL: 'tiny-embed',
      SLABSERVE_GATEWAY_THREADS: '1',
    });
  });

  afterAll(async () => {
    if (child && child.proc.exitCode === null && child.proc.signalCode === null) {
      child.proc.kill('SIGKILL');
      await child.exited;
    }
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it("answers the probes and the ServiceMonitor's path without a key, the API only with one", async () => {
    const c = deployment.spec.template.spec.containers[0] as Obj;
    const sm = docs.find((d) => d.obj.kind === 'ServiceMonitor')!.obj;
    for (const path of [c.readinessProbe.httpGet.path, c.livenessProbe.httpGet.path, sm.spec.endpoints[0].path ?? '/metrics']) {
      expect((await fetch(child!.url + path)).status, path).toBe(200);
    }
    const embed = (headers: Record<string, string>) =>
      fetch(child!.url + '/embed', { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ inputs: 'where is my parcel?' }) });
    expect((await embed({})).status).toBe(401);
    expect((await embed({ authorization: 'Bearer not-the-key' })).status).toBe(401);
    const ok = await embed({ authorization: `Bearer ${KEY}` });
    expect(ok.status).toBe(200);
    expect(((await ok.json()) as number[][])[0]).toHaveLength(128);
    child!.proc.kill('SIGTERM');
    expect(await child!.exited).toBe(0);
  });
});

describe('Dockerfile', () => {
  const ctx = () => ({ slabserveVars, included });

  it('builds on a CUDA 13 cuDNN runtime image, installs production dependencies only, runs as non-root with a /readyz healthcheck on 8080', () => {
    expect(dockerfileProblems(dockerfileText, ctx())).toEqual([]);
  });

  it('each broken requirement is reported', () => {
    const broken = (from: string | RegExp, to: string) => {
      const text = dockerfileText.replace(from, to);
      expect(text, `${from} is in the Dockerfile`).not.toBe(dockerfileText);
      return dockerfileProblems(text, ctx()).join('\n');
    };
    expect(broken(/nvidia\/cuda:13\.0\.\d+-cudnn-runtime-ubuntu24\.04/, 'nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04')).toMatch(/final image builds on nvidia\/cuda:12/);
    expect(broken(/-cudnn-runtime-/, '-runtime-')).toMatch(/final image builds on/);
    expect(broken(/^USER .*$/m, 'USER root')).toMatch(/runs as root/);
    expect(broken(/^USER .*$/m, '')).toMatch(/runs as root/);
    expect(broken("path:'/readyz'", "path:'/livez'")).toMatch(/HEALTHCHECK does not hit \/readyz/);
    expect(broken(/^EXPOSE .*$/m, 'EXPOSE 80')).toMatch(/EXPOSE 80, expected 8080/);
    expect(broken(/RUN npm ci --omit=dev/, 'RUN npm ci')).toMatch(/--omit=dev/);
    expect(broken('CMD ["node", "dist/src/cli.js", "serve"]', 'CMD ["node", "dist/src/cli.js", "serve", "--device", "auto"]')).toMatch(/CMD passes --device: a flag would override/);
    expect(broken(/^ENV ONNXRUNTIME_NODE_INSTALL=skip$/m, '')).toMatch(/npm ci without ONNXRUNTIME_NODE_INSTALL=skip/);
    expect(broken(/^ARG NODE_VERSION=24\./m, 'ARG NODE_VERSION=20.')).toMatch(/NODE_VERSION 20\.\S+ is not an LTS line/);
    expect(broken(/^ARG NODE_VERSION=24\./m, 'ARG NODE_VERSION=25.')).toMatch(/NODE_VERSION 25\.\S+ is not an LTS line/);
    expect(broken(/echo "\$\{NODE_SHA512\}  \/tmp\/node\.tgz" \| sha512sum -c -; /, '')).toMatch(/not checked against a pinned digest/);
    expect(broken(/^ARG NODE_SHA512=[0-9a-f]+$/m, 'ARG NODE_SHA512=TODO')).toMatch(/not a hex digest/);
    expect(broken(/SLABSERVE_DEVICE=auto$/m, 'SLABSERVE_DEVIC=auto')).toMatch(/SLABSERVE_DEVIC is not/);
    expect(broken(/RUN node scripts\/install-cuda-provider\.mjs/, 'RUN true')).toMatch(/CUDA provider/);
    expect(broken(/COPY --from=build \/app\/models \.\/models\n/, '')).toMatch(/models do not reach/);
    expect(broken('COPY src ./src', 'COPY source ./src')).toMatch(/source does not exist/);
  });

  it('.dockerignore lets the sources in and keeps build outputs, dependencies and generated models out', () => {
    for (const p of ['package.json', 'package-lock.json', 'tsconfig.json', 'src/main/server.ts', 'src/shared/telemetry/metrics.ts', 'models/generate.ts', 'scripts/install-cuda-provider.mjs']) {
      expect(included(p), p).toBe(true);
    }
    for (const p of ['node_modules/onnxruntime-node/package.json', 'dist/src/cli.js', 'models/tiny-embed/model.onnx', 'models/tiny-intent', '.git/HEAD', 'bench/results/quick.json']) {
      expect(included(p), p).toBe(false);
    }
  });

  it('the .dockerignore matcher follows Docker: parent folders, ** and ! exceptions', () => {
    const m = dockerignore('a/*\n!a/*.ts\n**/*.log\nb\n!b/keep\n');
    expect(m('a/x.ts')).toBe(true);
    expect(m('a/sub/x.ts')).toBe(false); // a/sub matches a/*
    expect(m('a/x.js')).toBe(false);
    expect(m('c/d/e.log')).toBe(false);
    expect(m('e.log')).toBe(false);
    expect(m('b/keep')).toBe(true);
    expect(m('b/other')).toBe(false);
    expect(m('c/d/e.txt')).toBe(true);
  });
});

describe('PromQL name extraction', () => {
  it('finds the series and labels of an expression, not its functions, keywords or durations', () => {
    const { selectors, groupLabels } = promqlNames(
      'histogram_quantile(0.99, sum by (le, model) (rate(slabserve_request_duration_seconds_bucket{job=~"$job", model!="a,b"}[$__rate_interval]))) ' +
        '/ on (model) group_left sum without (instance) (slabserve_slots) > bool 0 or {__name__="slabserve_ready", job="x"} offset 5m',
    );
    expect(selectors).toEqual([
      { name: 'slabserve_request_duration_seconds_bucket', labels: ['job', 'model'] },
      { name: 'slabserve_slots', labels: [] },
      { name: 'slabserve_ready', labels: ['job'] },
    ]);
    expect(groupLabels).toEqual(['le', 'model', 'model', 'instance']);
  });
});

describe('the real server (slabserve serve with the Deployment settings)', () => {
  let child: Child | undefined;
  let scrape: Metrics;
  let cat: Catalogue;

  beforeAll(async () => {
    const container = deployment.spec.template.spec.containers[0] as Obj;
    const dockerEnv = Object.fromEntries(
      parseDockerfile(dockerfileText)
        .flatMap((s) => s.body)
        .filter((i) => i.op === 'ENV')
        .flatMap((i) => [...i.args.matchAll(/(SLABSERVE_\w+)=(\S+)/g)].map((m) => [m[1]!, m[2]!])),
    );
    const deployEnv = Object.fromEntries((container.env as Obj[]).map((e) => [e.name as string, String(e.value)]));
    // this machine: any free port on loopback (HTTP's and gRPC's: without the image's fixed 8081), no GPU, the two small default models
    const { SLABSERVE_GRPC_PORT: _imageGrpcPort, ...imageEnv } = dockerEnv;
    child = await startCli({
      ...imageEnv,
      ...deployEnv,
      SLABSERVE_PORT: '0',
      SLABSERVE_HOST: '127.0.0.1',
      SLABSERVE_DEVICE: 'cpu',
      SLABSERVE_MODEL: 'tiny-embed,tiny-intent',
    });
    // traffic, so that the request, batch and failure series have samples
    const post = (path: string, body: unknown) =>
      fetch(child!.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    expect((await post('/embed', { inputs: ['where is my parcel?', 'cancel my plan'] })).status).toBe(200);
    expect((await post('/predict', { inputs: 'I want my money back' })).status).toBe(200);
    expect((await post('/embed', { inputs: 'x', model: 'no-such-model' })).status).toBe(404);
    const path = docs.find((d) => d.obj.kind === 'ServiceMonitor')!.obj.spec.endpoints[0].path ?? '/metrics';
    const res = await fetch(child.url + path);
    expect(res.status).toBe(200);
    scrape = parseMetrics(await res.text());
    cat = catalogue(scrape, declaredLabels());
  });

  afterAll(async () => {
    if (child && child.proc.exitCode === null && child.proc.signalCode === null) {
      child.proc.kill('SIGKILL');
      await child.exited;
    }
  });

  it('the scrape at the ServiceMonitor path is slabserve metrics, with samples from the traffic', () => {
    expect(scrape.sum('slabserve_ready')).toBe(1);
    expect(scrape.has('slabserve_request_duration_seconds_count', { model: 'tiny-embed', status: '200' })).toBe(true);
    expect(scrape.has('slabserve_request_failures_total', { reason: 'not_found' })).toBe(true);
    expect(scrape.has('slabserve_queue_depth', { model: 'tiny-embed' })).toBe(true);
  });

  it('every metric and label in the Grafana dashboard is in the scrape', () => {
    const exprs: { where: string; expr: string }[] = [];
    const walk = (panels: Obj[]) => {
      for (const p of panels) {
        for (const t of (p.targets ?? []) as Obj[]) exprs.push({ where: `panel "${p.title}" ${t.refId}`, expr: t.expr });
        walk(p.panels ?? []);
      }
    };
    walk(dashboard.panels);
    for (const v of dashboard.templating.list as Obj[]) {
      if (v.type !== 'query') continue;
      const q: string = typeof v.query === 'string' ? v.query : v.query.query;
      const m = /^label_values\((.+),\s*([a-zA-Z_]\w*)\)$/.exec(q.trim());
      expect(m, `variable ${v.name}: ${q}`).not.toBeNull();
      // the label asked for must be on the series: query it as a selector's matcher
      exprs.push({ where: `variable ${v.name}`, expr: m![1]!.includes('{') ? m![1]!.replace('}', `, ${m![2]}!=""}`) : `${m![1]}{${m![2]}!=""}` });
    }
    expect(exprs.length).toBeGreaterThanOrEqual(20);
    const problems = exprs.flatMap((e) => exprProblems(e.expr, cat, e.where));
    expect(problems).toEqual([]);
    // the panels the dashboard is for
    const all = exprs.map((e) => e.expr).join('\n');
    for (const name of [
      'slabserve_request_duration_seconds_count',
      'slabserve_request_duration_seconds_bucket',
      'slabserve_batch_fill_ratio_sum',
      'slabserve_batch_padding_efficiency_sum',
      'slabserve_queue_depth',
      'slabserve_slots_in_use',
      'slabserve_device_memory_bytes',
      'slabserve_request_failures_total',
      'slabserve_gateway_event_loop_lag_seconds',
    ]) {
      expect(all, name).toContain(name);
    }
  });

  it('the metric checks catch wrong names and labels', () => {
    expect(exprProblems('rate(slabserve_request_duration_seconds[1m])', cat, 'x').join()).toMatch(/a histogram: use _bucket/);
    expect(exprProblems('slabserve_queue_depth_bucket', cat, 'x').join()).toMatch(/not in the scrape/);
    expect(exprProblems('sum(rate(slabserve_requests_total[1m]))', cat, 'x').join()).toMatch(/slabserve_requests_total is not in the scrape/);
    expect(exprProblems('rate(slabserve_request_failures_total{model="a"}[1m])', cat, 'x').join()).toMatch(/has no label "model"/);
    expect(exprProblems('sum by (status) (slabserve_queue_depth)', cat, 'x').join()).toMatch(/grouping label "status"/);
    expect(exprProblems('histogram_quantile(0.9, sum by (le) (rate(slabserve_batch_size_bucket{model="a"}[1m])))', cat, 'x')).toEqual([]);
    expect(exprProblems('slabserve_device_memory_bytes{kind="used", device="cuda:0"}', cat, 'x')).toEqual([]);
  });

  it('the HPA metric comes from adapter rules whose series and queries are in the scrape', () => {
    const problems: string[] = [];
    for (const [i, r] of rules.entries()) {
      problems.push(...exprProblems(r.seriesQuery, cat, `adapter rule ${i} seriesQuery`));
      for (const s of promqlNames(r.seriesQuery).selectors) {
        problems.push(...exprProblems(renderMetricsQuery(r, s.name), cat, `adapter rule ${i} metricsQuery`));
        // a Pods metric needs samples to average
        if (!scrape.samples.some((x) => x.name === s.name)) problems.push(`adapter rule ${i}: ${s.name} has no samples`);
      }
    }
    expect(problems).toEqual([]);
    const hpa = docs.find((d) => d.obj.kind === 'HorizontalPodAutoscaler')!.obj;
    for (const m of hpa.spec.metrics as Obj[]) expect(adapterNames()).toContain(m.pods.metric.name);
  });

  it("answers the Deployment's probe paths with 200", async () => {
    const c = deployment.spec.template.spec.containers[0] as Obj;
    for (const probe of [c.readinessProbe, c.livenessProbe]) {
      const res = await fetch(child!.url + probe.httpGet.path);
      expect(res.status, probe.httpGet.path).toBe(200);
    }
  });

  it("the Dockerfile's HEALTHCHECK command passes against it and fails where nothing listens", async () => {
    const argv = healthcheckCommand(parseDockerfile(dockerfileText));
    expect(argv).not.toBeNull();
    const port = new URL(child!.url).port;
    expect(await runCommand(argv!, { SLABSERVE_PORT: port })).toBe(0);
    expect(await runCommand(argv!, { SLABSERVE_PORT: String(await closedPort()) })).not.toBe(0);
  });

  it('drains on SIGTERM and exits 0 (what the preStop hook and grace period leave time for)', async () => {
    child!.proc.kill('SIGTERM');
    expect(await child!.exited).toBe(0);
    expect(child!.stderr()).toMatch(/SIGTERM: draining/);
  });
});
