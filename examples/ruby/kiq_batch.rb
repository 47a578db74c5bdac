# Kiq::Batch: kiq batches (see kiq's README, "Batches") from a Ruby app that
# uses Sidekiq OSS, so the app can fan out jobs to kiq workers and have a
# callback run when they are done, by kiq or by the app's own Sidekiq.
#
#   require 'kiq_batch'
#   batch = Kiq::Batch.new(description: 'Import 2026-11')
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
# A job of the batch can add more jobs: Kiq::Batch.new(bid).jobs { ... }
# (bid from the job's payload, "bid"). The Redis steps are kiq's own Lua
# scripts (lua/ in kiq's source, or KIQ_LUA_DIR), so Ruby and C agree on
# every key and every rule.
require 'json'
require 'securerandom'
require 'sidekiq'

module Kiq
  class Batch
    EVENTS = %w[complete success death].freeze
    DAYS_30 = 30 * 24 * 3600

    attr_reader :bid

    def self.lua_dir
      ENV['KIQ_LUA_DIR'] || File.expand_path('../../lua', __dir__)
    end

    # A script's text as kiq embeds it: the lib/ functions it names with
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

    def self.run(name, keys, argv)
      Sidekiq.redis { |c| c.eval(script(name), keys: keys, argv: argv.map(&:to_s)) }
    end

    # The batch's fields (counters, description, *_at times), or nil.
    def self.status(bid)
      h = Sidekiq.redis { |c| c.hgetall("batch:#{bid}") }
      return nil if h.empty?
      h.merge('failures' => Sidekiq.redis { |c| c.hlen("batch:#{bid}:failures") })
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
    end

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
      outer = Thread.current[:kiq_batch]
      Thread.current[:kiq_batch] = self
      begin
        yield
      ensure
        Thread.current[:kiq_batch] = outer
      end
      commit
    end

    # Counts n more jobs before they are pushed (ClientMiddleware).
    def add(n)
      open!
      self.class.run('batch_add', ["batch:#{@bid}"], [n, @expiry])
    end

    private

    def open!
      return if @open
      if @reopen
        self.class.run('batch_open', ["batch:#{@bid}", 'batches'], [@bid, 'reopen', '', @expiry])
      else
        fields = ['linger', @linger, 'description', @description.to_s]
        @callbacks.each do |event, (klass, queue, opts)|
          fields += ["cb_#{event}_class", klass, "cb_#{event}_queue", queue, "cb_#{event}_opts", opts]
        end
        self.class.run('batch_open', ["batch:#{@bid}", 'batches'],
                       [@bid, 'new', @parent_bid.to_s, @expiry] + fields)
      end
      @open = true
    end

    def commit
      self.class.run('batch_commit', ["batch:#{@bid}"], [@bid])
    end

    # Sidekiq client middleware: a push inside Batch#jobs carries the bid,
    # counted in the batch before the job reaches its queue.
    class ClientMiddleware
      def call(_worker_class, job, _queue, _redis_pool)
        batch = Thread.current[:kiq_batch]
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
  config.client_middleware { |chain| chain.add Kiq::Batch::ClientMiddleware }
end
