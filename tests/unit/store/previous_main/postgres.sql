-- A store written by tx at a55a28d (before migrations) on PostgreSQL 15: pg_dump --inserts, less psql's settings.
CREATE TABLE public.checkpoints (
    run_id character varying(128) NOT NULL,
    checkpoint_id character varying(300) NOT NULL,
    kind character varying(32) NOT NULL,
    owner character varying(64) NOT NULL,
    size_bytes bigint NOT NULL,
    created_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone,
    user_metadata json,
    public boolean NOT NULL
);
CREATE TABLE public.sampling_sessions (
    sampling_session_id character varying(160) NOT NULL,
    session_id character varying(64) NOT NULL,
    owner character varying(64) NOT NULL,
    base_model character varying(256) NOT NULL,
    model_path character varying(512),
    run_id character varying(128),
    weights_dir character varying(1024),
    created_at timestamp with time zone NOT NULL
);
CREATE TABLE public.sessions (
    session_id character varying(64) NOT NULL,
    owner character varying(64) NOT NULL,
    sdk_version character varying(32),
    tags json NOT NULL,
    user_metadata json NOT NULL,
    created_at timestamp with time zone NOT NULL,
    last_heartbeat timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    finish_reason character varying(32),
    project_id character varying(128),
    display_name character varying(256)
);
CREATE TABLE public.training_runs (
    run_id character varying(128) NOT NULL,
    session_id character varying(64) NOT NULL,
    owner character varying(64) NOT NULL,
    base_model character varying(256) NOT NULL,
    lora_rank integer NOT NULL,
    lora_config json NOT NULL,
    user_metadata json,
    created_at timestamp with time zone NOT NULL,
    last_request_time timestamp with time zone NOT NULL,
    corrupted boolean NOT NULL
);
INSERT INTO public.checkpoints VALUES ('s1:train:0', 'weights/step-1', 'weights', 'tml-alice', 1234, '2026-11-24 09:30:00+00', '2027-12-29 09:30:00+00', 'null', true);
INSERT INTO public.checkpoints VALUES ('s1:train:0', 'sampler_weights/s1', 'sampler_weights', 'tml-alice', 99, '2026-11-24 09:30:00+00', NULL, NULL, false);
INSERT INTO public.sampling_sessions VALUES ('s1:sample:0', 's1', 'tml-alice', 'tiny-qwen3', 'tinker://s1:train:0/sampler_weights/s1', 's1:train:0', '/data/checkpoints/x', '2026-11-24 09:30:00+00');
INSERT INTO public.sessions VALUES ('s1', 'tml-alice', '0.38.0', '["a"]', '{"k": "v"}', '2026-11-24 09:30:00+00', '2026-11-24 09:30:00+00', NULL, NULL, 'p1', 'first');
INSERT INTO public.sessions VALUES ('s2', 'tml-bob', '0.38.0', '[]', '{}', '2026-11-24 09:30:00+00', '2026-11-24 09:30:00+00', '2026-11-25 16:12:36.22755+00', 'success', NULL, NULL);
INSERT INTO public.training_runs VALUES ('s1:train:0', 's1', 'tml-alice', 'tiny-qwen3', 8, '{"rank": 8, "seed": 0, "train_unembed": true, "train_mlp": true, "train_attn": true}', '{"note": "x"}', '2026-11-24 09:30:00+00', '2026-11-24 09:30:00+00', false);
ALTER TABLE ONLY public.checkpoints
    ADD CONSTRAINT checkpoints_pkey PRIMARY KEY (run_id, checkpoint_id);
ALTER TABLE ONLY public.sampling_sessions
    ADD CONSTRAINT sampling_sessions_pkey PRIMARY KEY (sampling_session_id);
ALTER TABLE ONLY public.sessions
    ADD CONSTRAINT sessions_pkey PRIMARY KEY (session_id);
ALTER TABLE ONLY public.training_runs
    ADD CONSTRAINT training_runs_pkey PRIMARY KEY (run_id);
CREATE INDEX ix_checkpoints_expires_at ON public.checkpoints USING btree (expires_at);
CREATE INDEX ix_checkpoints_owner ON public.checkpoints USING btree (owner);
CREATE INDEX ix_sampling_sessions_owner ON public.sampling_sessions USING btree (owner);
CREATE INDEX ix_sampling_sessions_session_id ON public.sampling_sessions USING btree (session_id);
CREATE INDEX ix_sessions_owner ON public.sessions USING btree (owner);
CREATE INDEX ix_training_runs_owner ON public.training_runs USING btree (owner);
CREATE INDEX ix_training_runs_session_id ON public.training_runs USING btree (session_id);
ALTER TABLE ONLY public.checkpoints
    ADD CONSTRAINT checkpoints_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.training_runs(run_id);
ALTER TABLE ONLY public.sampling_sessions
    ADD CONSTRAINT sampling_sessions_session_id_fkey FOREIGN KEY (session_id) REFERENCES public.sessions(session_id);
ALTER TABLE ONLY public.training_runs
    ADD CONSTRAINT training_runs_session_id_fkey FOREIGN KEY (session_id) REFERENCES public.sessions(session_id);
