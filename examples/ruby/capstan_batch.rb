# Capstan::Batch: capstan batches (see capstan's README, "Batches") from a Ruby app that
# uses Sidekiq OSS, so the app can fan out jobs to capstan workers and have a
# callback run when they are done, by capstan or by the app's own Sidekiq.
#
#   require 'capstan_batch'
#   batch = Capstan::Batch.new(description: 'Import 2026-11')
#   batch.on(:success, 'ImportDone', queue: 'default', options: { 'import_id' => 7 })
#   batch.jobs do
#     rows.each { |r| ImportRow.perform_async(r) }   # any push in the block joins
#   end
#
#   class ImportDone
#     include Sidekiq::Worker
#     def perform(status, options)   # status: bid, event, total, pending, failures, ...
#     end
#   end
#
# A job of the batch can add more jobs: Capstan::Batch.new(bid).jobs { ... }
# (bid from the job's payload, "bid"). The Redis steps are capstan's own Lua
# scripts, so Ruby and C agree on every key and every rule. They are read
# from beside this file: `meson install` puts it in share/capstan/ruby and
# them in share/capstan/lua (require it from there, with its full path or
# that folder on the load path); in capstan's source tree, lua/ is found
# too. Only a copy of this file kept elsewhere needs CAPSTAN_LUA_DIR.
#
# It works on Sidekiq 6.x (redis-rb connections) and 7.x and 8.x
# (redis-client connections).
#
# With Capstan::Shards (capstan_shards.rb) configured, a batch lives in one
# shard, its home, as capstan's C client places it: the shard that holds it
# (a reopen), else its parent's (a child), else the rendezvous pick of its
# bid among every shard. Its steps and the pushes of its `jobs` block go
# to that shard's pool (Sidekiq::Client.via).
#
# In a Sidekiq server process, a job of a batch that Sidekiq runs counts in
# its batch as under capstan (Capstan::Batch::ServerMiddleware and a death
# handler): succeeded, failed (a retry is due) or dead. So the batch's jobs,
# and a child batch's callbacks (jobs of the parent), may run on either.
# Sidekiq's basic fetch loses a job whose process is killed mid-job; such a
# job never counts, and its batch never succeeds.
require 'digest'
require 'json'
require 'securerandom'
require 'sidekiq'

module Capstan
  class Batch
    EVENTS = %w[complete success death].freeze
    DAYS_30 = 30 * 24 * 3600

    attr_reader :bid

    # Where the scripts are: share/capstan/lua beside share/capstan/ruby as
    # installed, lua/ two levels up in capstan's source tree (so the scripts
    # always match this file), and only then CAPSTAN_LUA_DIR.
    def self.lua_dir
      @lua_dir ||= begin
        beside = [File.expand_path('../lua', __dir__), File.expand_path('../../lua', __dir__)]
        env = ENV['CAPSTAN_LUA_DIR'].to_s
        dir = beside.find { |d| File.file?(File.join(d, 'batch_open.lua')) }
        dir ||= env unless env.empty?
        dir or raise "capstan's Lua scripts are not in #{beside.join(' or ')}: " \
                     'install capstan (meson install), or set CAPSTAN_LUA_DIR to its lua/ folder'
      end
    end

    # A script's text as capstan embeds it: the lib/ functions it names with
    # "-- uses: NAME" first, each once, what a lib uses before it.
    def self.script(name)
      @scripts ||= {}
      @scripts[name] ||= begin
        text = File.read(File.join(lua_dir, "#{name}.lua"))
        libs(text, []).join + text
      end
    end

    def self.libs(text, seen)
      text.scan(/^-- uses: ([a-z_]+)[ \t]*$/).flatten.flat_map do |l|
        next [] if seen.include?(l)
        seen << l
        lib = File.read(File.join(lua_dir, 'lib', "#{l}.lua"))
        libs(lib, seen) + [lib]
      end
    end

    # What differs between the two Redis clients Sidekiq hands out: how a
    # script is called, and the errors raised.
    #
    # redis-rb: Sidekiq 6.x's connections (Redis, or Redis::Namespace).
    module RedisRbApi
      def self.script(conn, command, script, keys, argv)
        conn.public_send(command, script, keys: keys, argv: argv)
      end

      def self.error?(error, command_only: false)
        error.is_a?(command_only ? ::Redis::CommandError : ::Redis::BaseError)
      end
    end

    # redis-client: Sidekiq 7.x's and 8.x's connections (and 6.5's when
    # configured so), which take commands as words.
    module RedisClientApi
      def self.script(conn, command, script, keys, argv)
        conn.call(command.to_s.upcase, script, keys.size, *keys, *argv)
      end

      def self.error?(error, command_only: false)
        error.is_a?(command_only ? ::RedisClient::CommandError : ::RedisClient::Error)
      end
    end

    # The API of Sidekiq's connections, found on the first one.
    def self.api(conn)
      @api ||=
        if defined?(::RedisClient) &&
           (conn.is_a?(::RedisClient) ||
            (defined?(::RedisClient::Decorator::Client) && conn.is_a?(::RedisClient::Decorator::Client)))
          RedisClientApi
        else
          RedisRbApi
        end
    end

    # Whether error came from Redis (a command's error or a lost
    # connection), once a connection told which client is in use.
    def self.redis_error?(error)
      !@api.nil? && @api.error?(error)
    end

    # Runs script name in pool (a ConnectionPool), or Sidekiq's own.
    def self.run(name, keys, argv, pool = nil)
      text = script(name)
      @shas ||= {}
      sha = (@shas[name] ||= Digest::SHA1.hexdigest(text))
      argv = argv.map(&:to_s)
      (pool || Sidekiq).send(pool ? :with : :redis) do |c|
        redis = api(c)
        begin
          redis.script(c, :evalsha, sha, keys, argv)
        rescue StandardError => e
          raise unless redis.error?(e, command_only: true) && e.message.start_with?('NOSCRIPT')
          redis.script(c, :eval, text, keys, argv)
        end
      end
    end

    # Counts the end of a run of job (a payload Hash with "bid") in its
    # batch: outcome "s" (succeeded), "f" (failed) or "d" (dead), with the
    # error kept for "f" and "d". The same step as a capstan worker's ack
    # (lua/ack.lua, without a working list): a jid counts once, so the step
    # is tried again (three times in all) when Redis fails it; then the
    # error is raised.
    def self.job_done(job, outcome, error = nil)
      stored = ''
      if error
        # Only the fields the batch keeps, as valid UTF-8 and cut as
        # Sidekiq cuts a stored message.
        message = error.message.to_s.dup.force_encoding(Encoding::UTF_8).scrub('?')[0, 10_000]
        stored = JSON.generate('error_class' => error.class.name, 'error_message' => message)
      end
      tries = 0
      begin
        run('ack', ['', '', '', '', "batch:#{job['bid']}"],
            ['', 'drop', 0, stored, 0, 0, '', job['bid'], job['jid'], outcome])
      rescue StandardError => e
        tries += 1
        raise if tries >= 3 || !redis_error?(e)
        sleep(0.05 * tries)
        retry
      end
    end

    # The shard names in capstan.yml's order, or nil without Capstan::Shards.
    def self.shards
      defined?(Capstan::Shards) && Capstan::Shards.respond_to?(:names) ? Capstan::Shards.names : nil
    rescue RuntimeError # not configured
      nil
    end

    # The home shard of batch bid, nil without shards: the first that holds
    # it, trying the rendezvous pick of its bid first (capstan's C client
    # looks in that order), else that pick.
    def self.home(bid)
      names = shards or return nil
      first = Capstan::Shards.pick(bid, names)
      ([first] + (names - [first])).find do |n|
        run_text(Capstan::Shards.pool(n), "return redis.call('EXISTS', KEYS[1])", ["batch:#{bid}"]).to_i > 0
      end || first
    end

    def self.run_text(pool, text, keys)
      pool.with { |c| api(c).script(c, :eval, text, keys, []) }
    end

    # The batch's fields (counters, description, *_at times), or nil.
    def self.status(bid)
      home = self.home(bid)
      pool = home ? Capstan::Shards.pool(home) : nil
      with = ->(&blk) { pool ? pool.with(&blk) : Sidekiq.redis(&blk) }
      h = with.call { |c| c.hgetall("batch:#{bid}") }
      return nil if h.empty?
      h.merge('failures' => with.call { |c| c.hlen("batch:#{bid}:failures") })
    end

    # With a bid: reopens that batch (jobs go on adding to it); without, a
    # new batch, written at its first push.
    def initialize(bid = nil, description: nil, parent_bid: nil, linger: DAYS_30, expiry: DAYS_30)
      @reopen = !bid.nil?
      @bid = bid || SecureRandom.hex(8)
      @description = description
      @parent_bid = parent_bid
      @linger = Integer(linger)
      @expiry = Integer(expiry)
      @callbacks = {}
      @open = false
      # A child lives in its parent's shard, where its link and callbacks
      # are counted.
      parent = @parent_bid.to_s.empty? ? nil : @parent_bid
      home = @reopen || parent ? self.class.home(@reopen ? @bid : parent) : nil
      home ||= (names = self.class.shards) && Capstan::Shards.pick(@bid, names)
      @pool = home && Capstan::Shards.pool(home)
      @home = home
    end

    # The shard the batch lives in, nil without Capstan::Shards.
    attr_reader :home

    # The callback for event: a job of klass on queue with args [status,
    # options]. A malformed one is refused here, before anything is written.
    def on(event, klass, queue: 'default', options: {})
      event = event.to_s
      raise ArgumentError, "no such batch event #{event.inspect}" unless EVENTS.include?(event)
      raise ArgumentError, 'callbacks are set on a new batch' if @reopen || @open
      klass = klass.to_s
      raise ArgumentError, "the #{event} callback needs a class name" if klass.empty? || klass =~ /\s/
      raise ArgumentError, "bad queue name #{queue.inspect}" if queue.to_s.empty? || queue.to_s =~ /\s/
      raise ArgumentError, "the #{event} callback's options must be a Hash" unless options.is_a?(Hash)
      @callbacks[event] = [klass, queue.to_s, JSON.generate(options)]
      self
    end

    # Pushes made in the block (by this thread) join the batch; then it is
    # committed: its callbacks may fire from then on.
    def jobs
      open!
      outer = Thread.current[:capstan_batch]
      Thread.current[:capstan_batch] = self
      begin
        @pool ? Sidekiq::Client.via(@pool) { yield } : yield
      ensure
        Thread.current[:capstan_batch] = outer
      end
      commit
    end

    # Counts n more jobs before they are pushed (ClientMiddleware).
    def add(n)
      open!
      self.class.run('batch_add', own_keys, [n, @expiry], @pool)
    end

    private

    def open!
      return if @open
      if @reopen
        self.class.run('batch_open', ["batch:#{@bid}", 'batches'], [@bid, 'reopen', '', @expiry], @pool)
      else
        fields = ['linger', @linger, 'description', @description.to_s]
        @callbacks.each do |event, (klass, queue, opts)|
          fields += ["cb_#{event}_class", klass, "cb_#{event}_queue", queue, "cb_#{event}_opts", opts]
        end
        # Every key the script touches is declared (Dragonfly, cluster proxies).
        keys = ["batch:#{@bid}", 'batches', "batch:#{@bid}:jids", 'batches:open']
        keys << "batch:#{@parent_bid}" if @parent_bid && !@parent_bid.to_s.empty?
        self.class.run('batch_open', keys, [@bid, 'new', @parent_bid.to_s, @expiry] + fields, @pool)
      end
      @open = true
    end

    def commit
      self.class.run('batch_commit', own_keys + ['batches:open', 'queues'], [@bid], @pool)
    end

    # The batch's keys, in the order the scripts declare them.
    def own_keys
      ["batch:#{@bid}", "batch:#{@bid}:jids", "batch:#{@bid}:failures"]
    end

    # For a Sidekiq job class: bid, the batch the running job belongs to (or
    # nil), and batch, a handle that adds jobs to it:
    #   class Step; include Sidekiq::Worker; include Capstan::Batch::Member
    #     def perform; batch.jobs { Next.perform_async }; end; end
    module Member
      attr_accessor :bid

      def batch
        bid && Capstan::Batch.new(bid)
      end
    end

    # Sidekiq server middleware: a job of a batch counts in it when it ends.
    # A job stopped by Sidekiq's shutdown goes back to its queue and counts
    # nothing. An error raised before the middleware runs (a class Sidekiq
    # cannot load) counts only when the job dies.
    class ServerMiddleware
      def call(worker, job, _queue)
        return yield unless job['bid']
        worker.bid = job['bid'] if worker.respond_to?(:bid=)
        begin
          yield
        rescue Exception => e # rubocop:disable Lint/RescueException
          Batch.job_done(job, 'f', e) unless ServerMiddleware.shutdown?(e)
          raise
        end
        Batch.job_done(job, 's')
      end

      def self.shutdown?(error)
        seen = {}
        while error && !seen[error.object_id]
          return true if error.is_a?(Sidekiq::Shutdown)
          seen[error.object_id] = true
          error = error.cause
        end
        false
      end
    end

    # Sidekiq death handler: a job of a batch that died. Sidekiq also calls
    # it for a job it drops (retry: false, or dead: false when the retries
    # are spent): that is a failure, as capstan counts a dropped job, not a
    # death (the dead set never holds it).
    DEATH = lambda do |job, error|
      next unless job['bid']
      kept = job['retry'] && job['dead'] != false
      Batch.job_done(job, kept ? 'd' : 'f', error)
    end

    # Sidekiq client middleware: a push inside Batch#jobs carries the bid,
    # counted in the batch before the job reaches its queue.
    class ClientMiddleware
      def call(_worker_class, job, _queue, _redis_pool)
        batch = Thread.current[:capstan_batch]
        if batch && !job.key?('bid')
          batch.add(1)
          job['bid'] = batch.bid
        end
        yield
      end
    end
  end
end

Sidekiq.configure_client do |config|
  config.client_middleware { |chain| chain.add Capstan::Batch::ClientMiddleware }
end

Sidekiq.configure_server do |config|
  # A job may make or reopen a batch: its pushes join it too.
  config.client_middleware { |chain| chain.add Capstan::Batch::ClientMiddleware }
  config.server_middleware { |chain| chain.add Capstan::Batch::ServerMiddleware }
  config.death_handlers << Capstan::Batch::DEATH
end
