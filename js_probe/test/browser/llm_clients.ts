// Real LLM clients for the probe's browser tests (tests/probe/test_llm_tokens.py): the
// `openai` SDK and Vercel's `ai` SDK, bundled for the page. Each run returns, per stream,
// when the client code saw its first content (performance.now(), the probe's clock) and how
// many content events it saw, for the test to hold the probe's beacon against.
import OpenAI from "openai";
import { createOpenAI } from "@ai-sdk/openai";
import { streamText } from "ai";

interface Run {
  start: number; // performance.now() when the client was asked
  first?: number; // … when the client code saw the first content (text or a tool call)
  firstOutput?: number; // … the first output of any kind (reasoning included)
  end: number;
  events: number; // content (and reasoning) events the client saw
  text: string;
  times: number[]; // when the client code saw each of them
}
const now = (): number => performance.now();
const g = globalThis as Record<string, unknown>;

/** Chat Completions through the openai SDK: `stream: true`, usage on request. */
g.openaiChat = async (baseURL: string, query: Record<string, string>, usage: boolean): Promise<Run> => {
  const client = new OpenAI({ baseURL, apiKey: "x", dangerouslyAllowBrowser: true, maxRetries: 0 });
  const r: Run = { start: now(), end: 0, events: 0, text: "", times: [] };
  const stream = await client.chat.completions.create(
    {
      model: "tiny",
      messages: [{ role: "user", content: "hi" }],
      stream: true,
      ...(usage ? { stream_options: { include_usage: true } } : {}),
    },
    { query },
  );
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta as { content?: string; reasoning_content?: string } | undefined;
    if (d?.content || d?.reasoning_content) {
      const t = now();
      r.firstOutput ??= t;
      if (d.content) r.first ??= t;
      r.events++;
      r.times.push(t);
      r.text += d.content ?? "";
    }
  }
  r.end = now();
  return r;
};

/** The Responses API through the openai SDK. */
g.openaiResponses = async (baseURL: string, query: Record<string, string>): Promise<Run> => {
  const client = new OpenAI({ baseURL, apiKey: "x", dangerouslyAllowBrowser: true, maxRetries: 0 });
  const r: Run = { start: now(), end: 0, events: 0, text: "", times: [] };
  const stream = await client.responses.create({ model: "tiny", input: "hi", stream: true }, { query });
  for await (const e of stream) {
    const t = now();
    if (e.type == "response.output_text.delta" && e.delta) {
      r.firstOutput ??= t;
      r.first ??= t;
      r.events++;
      r.text += e.delta;
    } else if (e.type.startsWith("response.reasoning") && e.type.endsWith(".delta")) {
      r.firstOutput ??= t;
      r.events++;
    }
  }
  r.end = now();
  return r;
};

/** Vercel's AI SDK (`streamText`) on its OpenAI provider, Chat Completions. */
g.aiSdkChat = async (baseURL: string, query: string): Promise<Run> => {
  const provider = createOpenAI({ baseURL, apiKey: "x", fetch: (u, init) => fetch(String(u) + query, init) });
  const r: Run = { start: now(), end: 0, events: 0, text: "", times: [] };
  const result = streamText({ model: provider.chat("tiny"), prompt: "hi", maxRetries: 0 });
  for await (const part of result.fullStream) {
    if (part.type == "text-delta" && part.text) {
      const t = now();
      r.first ??= t;
      r.firstOutput ??= t;
      r.events++;
      r.times.push(t);
      r.text += part.text;
    } else if (part.type == "error") throw part.error;
  }
  r.end = now();
  return r;
};
